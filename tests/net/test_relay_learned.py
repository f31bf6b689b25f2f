"""Relays added and dropped while the relay client runs (learned by address exchange,
peerd.node.relaylearn), and relays named by DNS (peerd.net.relayclient, issue 27 item 2),
on loopback."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from peerd.net import bootstrap
from tests.net.hosts import run
from tests.net.relay_fixture import relay
from tests.net.test_relay_client import A, B, member, until


def test_a_learned_relay_is_reserved_on_at_once_and_let_go_when_dropped() -> None:
    async def body() -> None:
        async with relay() as r, trio.open_nursery() as nursery, AsyncExitStack() as stack:
            a = await stack.enter_async_context(member(A, [], nursery))
            assert a.client.states() == []
            assert a.client.circuit_addrs() == ()
            # Ourselves is never a learned relay.
            assert not a.client.set_learned([f"/ip4/127.0.0.1/tcp/1/p2p/{a.t.peer_id}"])
            assert a.client.set_learned([r.addr])
            assert not a.client.set_learned([r.addr])  # the same list changes nothing
            await until(lambda: bool(a.client.circuit_addrs()))
            assert a.client.circuit_addrs() == (f"{r.addr}/p2p-circuit",)
            [state] = a.client.states()
            assert (state.addr, state.learned, state.reservations) == (r.addr, True, 1)
            assert a.client.set_learned([])
            assert a.client.states() == []
            assert a.client.circuit_addrs() == ()
            nursery.cancel_scope.cancel()

    run(body, 60)


def test_a_configured_relay_is_never_taken_as_learned() -> None:
    async def body() -> None:
        async with relay() as r, trio.open_nursery() as nursery, AsyncExitStack() as stack:
            a = await stack.enter_async_context(member(A, [r.addr], nursery))
            assert not a.client.set_learned([r.addr])
            await until(lambda: bool(a.client.circuit_addrs()))
            assert [(s.addr, s.learned) for s in a.client.states()] == [(r.addr, False)]
            nursery.cancel_scope.cancel()

    run(body, 60)


def test_a_relay_named_by_dns_is_resolved_when_dialled() -> None:
    # "localhost" goes through the system resolver (getaddrinfo, /etc/hosts) as any name.
    async def body() -> None:
        async with relay() as r, trio.open_nursery() as nursery, AsyncExitStack() as stack:
            port = r.transport.listen_addrs[0].split("/")[4]
            named = f"/dns4/localhost/tcp/{port}/p2p/{r.transport.peer_id}"
            a = await stack.enter_async_context(member(A, [named], nursery))
            await until(lambda: bool(a.client.circuit_addrs()))
            # The circuit names the address dialled: peers need not resolve our relay.
            assert a.client.circuit_addrs() == (f"{r.addr}/p2p-circuit",)
            nursery.cancel_scope.cancel()

    run(body, 60)


def test_a_relay_name_that_does_not_resolve_is_retried_with_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    async def unresolvable(entry: bootstrap.Entry) -> tuple[str, ...]:
        asked.append(entry.host)
        raise OSError(f"{entry.host} has no address")

    monkeypatch.setattr(bootstrap, "resolve", unresolvable)

    async def body() -> None:
        async with relay() as r, trio.open_nursery() as nursery, AsyncExitStack() as stack:
            named = f"/dns4/relay.invalid/tcp/4011/p2p/{r.transport.peer_id}"
            b = await stack.enter_async_context(member(B, [named], nursery))
            await until(lambda: len(asked) >= 2)  # retried after its backoff
            [state] = b.client.states()
            assert state.reserved_until is None
            assert state.failures >= 1
            assert state.last_error == "cannot resolve: relay.invalid has no address"
            nursery.cancel_scope.cancel()

    run(body, 60)


