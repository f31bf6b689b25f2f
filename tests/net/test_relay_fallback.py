"""Two relays, and dialling around a dead one (peerd.net.relayclient, peerd.net.relaydial;
issue 27, relay loss), on loopback: a member that holds reservations at two relays is still
dialled through the second once the first is gone for good — its dead circuit tried last,
withdrawn from its rendezvous registration — and a direct address that never answers does
not hold the circuit back for the direct deadline."""

from __future__ import annotations

import socket
from contextlib import AsyncExitStack
from typing import Any

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.net import relaydial
from peerd.net.relaydial import rank_circuits
from peerd.protocol.identity import node_id_of
from tests.net.hosts import run
from tests.net.relay_fixture import relay
from tests.net.test_relay_client import A, B, free_port, member, until


def test_circuits_through_held_relays_come_first_and_lost_ones_last() -> None:
    c = {r: f"/ip4/192.0.2.1/tcp/1/p2p/{r}/p2p-circuit" for r in ("R1", "R2", "X")}
    order = rank_circuits([c["R1"], c["X"], c["R2"]], held={"R2"}, ours={"R1", "R2"})
    assert order == [c["R2"], c["X"], c["R1"]]
    # Nothing held: not ours before ours, each group in the given order.
    assert rank_circuits([c["R1"], c["R2"], c["X"]], held=(), ours={"R1", "R2"}) == \
        [c["X"], c["R1"], c["R2"]]


async def relay_until(stop: trio.Event, *,
                      task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """A relay in a task of its own (its nurseries nest there), until ``stop``."""
    async with relay() as r:
        task_status.started(r)
        await stop.wait()


def test_a_member_is_dialled_through_the_second_relay_once_the_first_is_gone() -> None:
    async def body() -> None:
        async with relay() as r2, trio.open_nursery() as nursery, AsyncExitStack() as stack:
            r1 = await nursery.start(relay_until, stop_r1 := trio.Event())
            a = await stack.enter_async_context(member(A, [r1.addr, r2.addr], nursery))
            b = await stack.enter_async_context(member(B, [r1.addr, r2.addr], nursery))
            both = (f"{r1.addr}/p2p-circuit", f"{r2.addr}/p2p-circuit")
            await until(lambda: a.client.circuit_addrs() == both
                        and b.client.circuit_addrs() == both)
            old = a.client.circuit_addrs()  # what a's record said: r1's circuit first
            stop_r1.set()  # r1 stops for good
            # Both lose r1's reservation; r2's is untouched by r1's retries.
            await until(lambda: a.client.circuit_addrs() == (both[1],)
                        and b.client.circuit_addrs() == (both[1],))
            assert b.client.states()[1].reserved_until is not None
            assert rank_circuits(old, {r2.transport.peer_id},
                                 {r1.transport.peer_id, r2.transport.peer_id}) == \
                [both[1], both[0]]
            # The stale list (r1 first) still gets b to a, through r2.
            with trio.fail_after(relaydial.CIRCUIT_DIAL_TIMEOUT_S):
                await b.client.connect(a.node.id, old)
            assert b.client.relayed_via(a.node.id) == r2.transport.peer_id
            # r2's rendezvous point no longer lists r1's circuit for a.
            b.found.clear()
            await until(lambda: b.found.get(a.node.id) == (both[1],))
            nursery.cancel_scope.cancel()

    run(body, 90)


def test_a_direct_address_that_never_answers_does_not_hold_back_the_circuit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The direct deadline made long: only the head start may stand before the circuit.
    monkeypatch.setattr(relaydial, "DIRECT_FIRST_TIMEOUT_S", 60.0)
    with socket.socket() as hole:  # accepts TCP, never speaks: the handshake stalls
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        stalled = f"/ip4/127.0.0.1/tcp/{hole.getsockname()[1]}"

        async def body() -> None:
            async with relay() as r, trio.open_nursery() as nursery, \
                    AsyncExitStack() as stack:
                a = await stack.enter_async_context(member(A, [r.addr], nursery))
                b = await stack.enter_async_context(member(B, [r.addr], nursery))
                await until(lambda: bool(a.client.circuit_addrs()))
                t0 = trio.current_time()
                await b.client.connect(a.node.id, (stalled, *a.client.circuit_addrs()))
                took = trio.current_time() - t0
                assert b.client.relayed_via(a.node.id) == r.transport.peer_id
                assert took < 30.0, took  # not the 60 s of the direct deadline
                # Reached through the circuit last time: the next dial gives the direct
                # addresses no head start (made 60 s here, so waiting it would show).
                monkeypatch.setattr(relaydial, "DIRECT_HEAD_START_S", 60.0)
                await b.t.disconnect(a.node.id)
                await until(lambda: not b.t.is_connected(a.node.id))
                t0 = trio.current_time()
                await b.client.connect(a.node.id, (stalled, *a.client.circuit_addrs()))
                assert trio.current_time() - t0 < 30.0
                assert b.client.relayed_via(a.node.id) == r.transport.peer_id
                nursery.cancel_scope.cancel()

        run(body, 90)


def test_a_dial_begun_while_the_relay_is_down_goes_through_it_once_it_is_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The dial's circuit fails at first (no relay); the reservation made anew meanwhile
    lets it through before its direct addresses give up (made to take 60 s here), instead
    of the whole dial failing after them and the peer being backed off."""
    monkeypatch.setattr(relaydial, "DIRECT_FIRST_TIMEOUT_S", 60.0)
    relay_key, port = Ed25519PrivateKey.generate(), free_port()
    addr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{node_id_of(relay_key)}"
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        stalled = f"/ip4/127.0.0.1/tcp/{hole.getsockname()[1]}"

        async def body() -> None:
            async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
                a = await stack.enter_async_context(member(A, [addr], nursery))
                b = await stack.enter_async_context(member(B, [addr], nursery))
                result: list[float] = []

                async def dial() -> None:
                    t0 = trio.current_time()
                    await b.client.connect(a.node.id, (stalled, f"{addr}/p2p-circuit"))
                    result.append(trio.current_time() - t0)

                nursery.start_soon(dial)
                await trio.sleep(relaydial.DIRECT_HEAD_START_S + 1.0)  # its circuit failed
                assert not result
                async with relay(key=relay_key, port=port) as r:
                    await until(lambda: bool(result), 30.0)
                    assert result[0] < 30.0, result
                    assert b.client.relayed_via(a.node.id) == r.transport.peer_id
                    nursery.cancel_scope.cancel()

        run(body, 90)
