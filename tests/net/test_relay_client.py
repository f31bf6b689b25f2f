"""The member side of Circuit Relay v2 (peerd.net.relayclient, issue 27 item 2), on loopback:
two hosts that know only the relay reserve, find each other at its rendezvous point and hold
a gossip session over the circuit; a short reservation is refreshed; a relay that restarts
is reserved at again; a non-member's relayed connection is refused like a direct one."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from libp2p.discovery.rendezvous.config import RENDEZVOUS_PROTOCOL
from libp2p.protocol_muxer.exceptions import MultiselectClientError

from peerd.net import relayclient, rendezvousclient
from peerd.net.ask import ask
from peerd.net.gossip import SessionResult, run_session
from peerd.net.relay import RelayService
from peerd.net.relayclient import UNKNOWN_RELAY, RelayClient, rendezvous_namespace
from peerd.net.transport import Stream, Transport, TransportError, open_transport
from peerd.node.state import NodeState
from peerd.protocol.identity import node_id_of
from peerd.protocol.peerrecord import is_circuit
from tests.net.hosts import LOOPBACK, run
from tests.net.relay_fixture import relay
from tests.net.test_gossip import CTX, publish, signed_node
from tests.node.fleet import FLEET, key

A, B, OUT = key(1), key(2), key(9)
MEMBERS = {signed_node(A, 1, A, B).id, signed_node(B, 1, A, B).id}


async def until(cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll: the states watched change in library tasks that signal nothing."""
    with trio.fail_after(timeout_s):
        while not cond():  # noqa: ASYNC110
            await trio.sleep(0.05)


@dataclass
class Member:
    node: NodeState
    t: Transport
    client: RelayClient
    found: dict[str, tuple[str, ...]] = field(default_factory=dict)
    sessions: list[SessionResult] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


@asynccontextmanager
async def member(k: Ed25519PrivateKey, relays: list[str], nursery: trio.Nursery, *,
                 discover_s: float = 0.3, retry_max_s: float = 1.0,
                 relay_service: bool = False) -> AsyncIterator[Member]:
    node = signed_node(k, 1, A, B)
    box: list[Member] = []

    async def serve(stream: Stream) -> None:  # the daemon's inbound session
        box[0].sessions.append(await run_session(stream, node, CTX, peer_id=stream.peer_id,
                                                 initiator=False))

    async with open_transport(k, serve, LOOPBACK, admit=MEMBERS.__contains__,
                              on_refused=lambda p: box[0].refused.append(p)) as t:
        found: dict[str, tuple[str, ...]] = {}
        client = RelayClient(t, relays, FLEET, is_member=MEMBERS.__contains__,
                             on_found=found.__setitem__, discover_interval_s=discover_s,
                             retry_max_s=retry_max_s)
        m = Member(node, t, client, found)
        box.append(m)
        if relay_service:  # [network] relay_service: its hop serves /stop for the client
            service = await stack_relay(t, nursery)
            nursery.start_soon(client.run, service.hop)
        else:
            nursery.start_soon(client.run)
        await client.started.wait()
        yield m


async def stack_relay(t: Transport, nursery: trio.Nursery) -> RelayService:
    service = RelayService(t.host)
    await nursery.start(service.run)
    return service


def test_the_namespace_is_the_fleets() -> None:
    assert rendezvous_namespace(bytes(range(16))) == "peerd/000102030405060708090a0b0c0d0e0f"


def test_two_members_meet_at_the_rendezvous_and_gossip_over_the_circuit() -> None:
    async def body() -> None:
        async with relay() as r, trio.open_nursery() as nursery, AsyncExitStack() as stack:
            a = await stack.enter_async_context(member(A, [r.addr], nursery))
            b = await stack.enter_async_context(member(B, [r.addr], nursery))
            publish(b.node, 4)
            await until(lambda: b.node.id in a.found)
            circuit = f"{r.addr}/p2p-circuit"
            assert a.client.circuit_addrs() == (circuit,)
            assert a.found[b.node.id] == (circuit,)  # its circuit, nothing else
            [state] = a.client.states()
            assert state.reservations >= 1
            assert state.registered
            assert state.found == 1
            # Only the circuit is known: the connection is relayed, Noise end to end.
            await a.client.connect(b.node.id, a.found[b.node.id])
            assert a.t.is_connected(b.node.id)
            assert a.client.relayed_via(b.node.id) == r.transport.peer_id
            async with a.t.open_stream(b.node.id) as stream:
                result = await run_session(stream, a.node, CTX, peer_id=b.node.id,
                                           initiator=True)
            assert result.received == 1
            assert [(i.meta.origin, i.meta.version) for i in a.node.cache] == [(b.node.id, 4)]
            await until(lambda: len(b.sessions) == 1)
            assert b.sessions[0].sent == 1
            assert b.client.relayed_via(a.node.id) == UNKNOWN_RELAY  # inbound, relayed
            nursery.cancel_scope.cancel()

    run(body, 60)


def test_a_direct_address_that_works_is_preferred_to_the_circuit() -> None:
    async def body() -> None:
        async with relay() as r, trio.open_nursery() as nursery, AsyncExitStack() as stack:
            a = await stack.enter_async_context(member(A, [r.addr], nursery))
            b = await stack.enter_async_context(member(B, [r.addr], nursery))
            await until(lambda: bool(b.client.circuit_addrs()))
            await a.client.connect(b.node.id, (*b.client.circuit_addrs(), b.t.listen_addrs[0]))
            assert a.t.is_connected(b.node.id)
            assert a.client.relayed_via(b.node.id) is None  # a TCP connection, no circuit
            await until(lambda: len(b.t.connected_peers()) == 2)  # the relay and a
            assert b.client.relayed_via(a.node.id) is None
            nursery.cancel_scope.cancel()

    run(body, 60)


def test_a_member_running_a_relay_service_is_dialled_through_another_relay() -> None:
    async def body() -> None:
        async with relay() as r, trio.open_nursery() as nursery, AsyncExitStack() as stack:
            a = await stack.enter_async_context(member(A, [r.addr], nursery,
                                                       relay_service=True))
            b = await stack.enter_async_context(member(B, [r.addr], nursery))
            publish(a.node, 2)
            await until(lambda: a.node.id in b.found)
            await b.client.connect(a.node.id, b.found[a.node.id])
            assert b.client.relayed_via(a.node.id) == r.transport.peer_id
            async with b.t.open_stream(a.node.id) as stream:
                result = await run_session(stream, b.node, CTX, peer_id=a.node.id,
                                           initiator=True)
            assert result.received == 1
            nursery.cancel_scope.cancel()

    run(body, 60)


def test_a_short_reservation_is_refreshed_before_it_ends() -> None:
    async def body() -> None:
        async with relay(reservation_ttl=4) as r, trio.open_nursery() as nursery, \
                AsyncExitStack() as stack:
            a = await stack.enter_async_context(member(A, [r.addr], nursery))
            await until(lambda: bool(a.client.circuit_addrs()))
            first = a.client.states()[0].reserved_until
            assert first is not None
            await trio.sleep(7)  # past the first reservation's end
            [state] = a.client.states()
            assert state.reservations >= 3
            assert state.reserved_until is not None
            assert state.reserved_until > first
            assert a.client.circuit_addrs() == (f"{r.addr}/p2p-circuit",)
            # Still dialable through it.
            b = await stack.enter_async_context(member(B, [r.addr], nursery))
            await b.client.connect(a.node.id, a.client.circuit_addrs())
            assert b.t.is_connected(a.node.id)
            nursery.cancel_scope.cancel()

    run(body, 60)


def test_a_long_reservation_is_refreshed_at_most_refresh_max_s_apart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A relay that grants 600 s would be asked again at 300 s; the cap (10 min in production,
    # 1 s here) bounds how long a relay that drops reservations early (js-libp2p's) can keep
    # the member undialable.
    monkeypatch.setattr(relayclient, "REFRESH_MAX_S", 1.0)

    async def body() -> None:
        async with relay(reservation_ttl=600) as r, trio.open_nursery() as nursery, \
                AsyncExitStack() as stack:
            a = await stack.enter_async_context(member(A, [r.addr], nursery))
            await until(lambda: bool(a.client.circuit_addrs()))
            await trio.sleep(3.5)
            [state] = a.client.states()
            assert state.reservations >= 3
            assert state.failures == 0
            nursery.cancel_scope.cancel()

    run(body, 60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_relay_that_restarts_is_reserved_at_again() -> None:
    relay_key, port = Ed25519PrivateKey.generate(), free_port()
    addr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{node_id_of(relay_key)}"

    async def body() -> None:
        async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
            # Configured before the relay runs: retried with backoff until it answers.
            a = await stack.enter_async_context(member(A, [addr], nursery))
            b = await stack.enter_async_context(member(B, [addr], nursery))
            await until(lambda: a.client.states()[0].failures >= 1)
            async with relay(key=relay_key, port=port) as r:
                assert r.addr == addr
                await until(lambda: bool(a.client.circuit_addrs()))
            # The relay is gone: the circuit is no longer offered.
            await until(lambda: not a.client.circuit_addrs())
            held = a.client.states()[0]
            assert held.failures >= 2
            assert held.reserved_until is None
            async with relay(key=relay_key, port=port):
                await until(lambda: bool(a.client.circuit_addrs()))
                assert a.client.states()[0].reservations > held.reservations
                # Both registered again at the new relay's (empty) rendezvous point.
                b.found.clear()
                await until(lambda: a.node.id in b.found)
                await b.client.connect(a.node.id, b.found[a.node.id])
                assert b.t.is_connected(a.node.id)
                nursery.cancel_scope.cancel()

    run(body, 60)


def test_a_reservation_cut_with_the_non_members_connections_is_made_again() -> None:
    async def body() -> None:
        async with relay() as r, trio.open_nursery() as nursery, AsyncExitStack() as stack:
            a = await stack.enter_async_context(member(A, [r.addr], nursery))
            await until(lambda: bool(a.client.circuit_addrs()))
            made = a.client.states()[0].reservations
            # A new manifest closes every non-member's connection, the relay's among them.
            assert a.t.close_unadmitted() == 1
            await until(lambda: a.client.states()[0].reservations > made, 5)
            assert a.client.circuit_addrs() == (f"{r.addr}/p2p-circuit",)
            nursery.cancel_scope.cancel()

    run(body, 60)


def test_a_non_members_relayed_connection_is_refused_like_a_direct_one() -> None:
    async def body() -> None:
        async with relay() as r, trio.open_nursery() as nursery, AsyncExitStack() as stack:
            a = await stack.enter_async_context(member(A, [r.addr], nursery))
            await until(lambda: bool(a.client.circuit_addrs()))
            # An outsider with its own (working) relay client dials a's circuit.
            async with open_transport(OUT, lambda s: s.reset(), LOOPBACK) as out_t:
                out = RelayClient(out_t, [], FLEET, is_member=lambda _: True,
                                  on_found=lambda *_: None)
                nursery.start_soon(out.run)
                await out.started.wait()
                # Closed during or right after the handshake: refused either way.
                with contextlib.suppress(TransportError):
                    await out.connect(a.node.id, a.client.circuit_addrs())
                await until(lambda: len(a.refused) == 1)
                assert a.refused == [out_t.peer_id]
                await until(lambda: not a.t.is_connected(out_t.peer_id))
                assert a.t.refused_connections == 1
            nursery.cancel_scope.cancel()

    run(body, 60)


def test_only_circuit_shaped_addresses_are_circuits() -> None:
    assert is_circuit("/ip4/1.2.3.4/tcp/1/p2p/X/p2p-circuit")
    assert not is_circuit("/ip4/1.2.3.4/tcp/1")


def test_a_relay_without_a_rendezvous_point_is_not_asked_again_and_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """js-libp2p's relay runs no rendezvous point: its ``na`` stops the asking (each refused
    stream also logs an error line in py-libp2p) until the relay is connected anew."""
    asked: list[str] = []

    async def counting_ask(*args: Any) -> bytes:
        asked.append(str(args[2]))
        return await ask(*args)

    monkeypatch.setattr(rendezvousclient, "ask", counting_ask)

    async def body() -> None:
        async with relay() as r, trio.open_nursery() as nursery, AsyncExitStack() as stack:
            r.transport.host.remove_stream_handler(RENDEZVOUS_PROTOCOL)
            a = await stack.enter_async_context(member(A, [r.addr], nursery, discover_s=0.1))
            await until(lambda: a.client.states()[0].rendezvous is False)
            await trio.sleep(1.5)  # 15 DISCOVER intervals
            [state] = a.client.states()
            assert state.reserved_until is not None  # it still relays
            assert not state.registered
            assert len(asked) == 1, asked  # the REGISTER that drew the na; no DISCOVER
            nursery.cancel_scope.cancel()

    run(body, 60)


def test_only_the_peers_na_counts_as_no_rendezvous_point() -> None:
    na = MultiselectClientError("protocols not supported: tried ['/rendezvous/1.0.0']")
    wrapped = RuntimeError("failed to open a stream to peer x")
    wrapped.__cause__ = na  # as py-libp2p's new_stream raises it: StreamFailure from the na
    assert rendezvousclient.refused(wrapped)
    assert not rendezvousclient.refused(MultiselectClientError("response timed out after 5s"))
    assert not rendezvousclient.refused(trio.TooSlowError())
