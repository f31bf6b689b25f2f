"""A js-libp2p Circuit Relay v2 relay as ``[network] relays`` (issue 27 item 4): the member
side (peerd.net.relayclient) against a relay that is not py-libp2p. Member A reserves at the
js relay (tests/net/js_relay/relay.mjs); member B dials A's circuit address through it and a
gossip session runs over the circuit. js-libp2p has no rendezvous point, so B is given A's
circuit address; A's registration there fails and the reservation is kept all the same.

Skipped when node or ``npm install`` in tests/net/js_relay is missing."""

from __future__ import annotations

import json
import select
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from peerd.net.gossip import run_session
from tests.net.hosts import run
from tests.net.test_gossip import CTX, publish
from tests.net.test_relay_client import A, B, member, until

JS_RELAY = Path(__file__).parent / "js_relay"
#: How long the relay may take to print its address (node's start-up, js-libp2p's).
START_TIMEOUT_S = 20.0


@dataclass
class JsRelay:
    peer_id: str
    addr: str  #: ``/ip4/127.0.0.1/tcp/P/p2p/<id>``: what ``[network] relays`` names


@contextmanager
def js_relay() -> Iterator[JsRelay]:
    node = shutil.which("node")
    if node is None or not (JS_RELAY / "node_modules").exists():
        pytest.skip(f"needs node and `npm install` in {JS_RELAY}")
    proc = subprocess.Popen([node, str(JS_RELAY / "relay.mjs"), "0"], cwd=JS_RELAY,  # noqa: S603
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("{"):
            pytest.fail(f"the js relay did not start (exit {proc.poll()}): {line!r}")
        info = json.loads(line)
        yield JsRelay(info["peer_id"], info["addr"])
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_member_reserves_at_a_js_relay_and_is_dialled_through_it() -> None:
    with js_relay() as r:
        async def body() -> None:
            async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
                started = time.monotonic()
                a = await stack.enter_async_context(member(A, [r.addr], nursery))
                await until(lambda: bool(a.client.circuit_addrs()))
                reserved_s = time.monotonic() - started
                circuit = f"{r.addr}/p2p-circuit"
                assert a.client.circuit_addrs() == (circuit,)
                [state] = a.client.states()
                assert state.reservations == 1
                assert state.reserved_until is not None
                assert state.reserved_until > time.time() + 30 * 60  # the relay's 1 h
                # B knows only A's circuit (no rendezvous point at a js relay to learn it).
                b = await stack.enter_async_context(member(B, [], nursery))
                publish(a.node, 3)
                started = time.monotonic()
                await b.client.connect(a.node.id, (circuit,))
                dialled_s = time.monotonic() - started
                assert b.t.is_connected(a.node.id)
                assert b.client.relayed_via(a.node.id) == r.peer_id
                async with b.t.open_stream(a.node.id) as stream:
                    result = await run_session(stream, b.node, CTX, peer_id=a.node.id,
                                               initiator=True)
                assert result.received == 1
                assert [(i.meta.origin, i.meta.version) for i in b.node.cache] == \
                    [(a.node.id, 3)]
                await until(lambda: len(a.sessions) == 1)
                assert a.sessions[0].sent == 1
                print(f"reserved in {reserved_s:.2f} s, circuit dialled in {dialled_s:.2f} s")
                nursery.cancel_scope.cancel()

        run(body, 60)


def test_a_relay_without_a_rendezvous_point_keeps_the_reservation() -> None:
    """Registration and discovery fail (the relay does not speak rendezvous): logged, not
    counted as failures, and neither the reservation nor the connection is dropped."""
    with js_relay() as r:
        async def body() -> None:
            async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
                a = await stack.enter_async_context(member(A, [r.addr], nursery,
                                                           discover_s=0.2))
                await until(lambda: bool(a.client.circuit_addrs()))
                await trio.sleep(2)  # some ten DISCOVER attempts
                [state] = a.client.states()
                assert not state.registered
                assert state.found == 0
                assert state.failures == 0
                assert state.last_error is None
                assert state.reservations == 1  # the same reservation, never lost
                assert a.client.circuit_addrs() == (f"{r.addr}/p2p-circuit",)
                assert a.t.is_connected(r.peer_id)
                nursery.cancel_scope.cancel()

        run(body, 30)
