"""Mend 8 of the transport: who may hold a connection (issue 12, item 11).

Outsiders need no membership to connect: any fresh key completes Noise. py-libp2p 0.8.1 lets
256 of them hold every established inbound slot, and nothing closed them, so members were
locked out (reproduced: 256 throw-away keys, then a member's dial failed 3 times of 3).
With the daemon's membership predicate (``admit``), a non-member's connection is closed
right after its handshake, a few on probation after one session, and admitted peers bypass
the connection limits. Loopback only, one trio process; the strangers are bare Noise +
Yamux connections (tests/net/strangers.py).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.daemon.gossiping import GOSSIP_INTERVAL_S
from peerd.net.admission import Admission
from peerd.net.transport import (
    Stream,
    Transport,
    TransportConfig,
    TransportError,
    open_transport,
    read_frame,
    write_frame,
)
from peerd.net.transport_config import MAX_PROBATION_CONNECTIONS
from peerd.protocol.identity import node_id_of
from tests.net.hosts import echo, host, run
from tests.net.strangers import strangers

#: Every test body here runs under this deadline (the floods need more than the default of
#: tests.net.hosts), so a hang fails instead of stalling CI.
TEST_DEADLINE_S = 60.0
#: The flood of the issue's done-when: 300 stranger connections held open.
FLOOD = 300
#: What py-libp2p 0.8.1's resource manager lets in (ConnectionLimits.max_established_inbound).
LIBP2P_INBOUND_LIMIT = 256


class Target:
    """A host that admits the ids in ``members`` and counts what it closes."""

    def __init__(self) -> None:
        self.members: set[str] = set()
        self.refused: list[str] = []
        self.disconnected: list[str] = []
        self._changed = trio.Event()
        self.t: Transport | None = None

    def admit(self, peer_id: str) -> bool:
        return peer_id in self.members

    def on_refused(self, peer_id: str) -> None:
        self.refused.append(peer_id)
        self._changed.set()

    def on_disconnected(self, peer_id: str) -> None:
        self.disconnected.append(peer_id)
        self._changed.set()

    def on_connected(self, peer_id: str) -> None:
        self._changed.set()

    async def until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            self._changed = trio.Event()
            await self._changed.wait()

    @property
    def addr(self) -> str:
        assert self.t is not None
        return self.t.listen_addrs[0]


@asynccontextmanager
async def target(handler: Callable[[Stream], Awaitable[None]] = echo,
                 **limits: float) -> AsyncIterator[Target]:
    tg = Target()
    config = TransportConfig(listen_host="127.0.0.1", **limits)  # type: ignore[arg-type]
    async with open_transport(Ed25519PrivateKey.generate(), handler, config, admit=tg.admit,
                              on_refused=tg.on_refused, on_connected=tg.on_connected,
                              on_disconnected=tg.on_disconnected) as t:
        tg.t = t
        yield tg


async def exchange(member: Transport, tg: Target) -> float:
    """Seconds a member takes to connect to ``tg`` and get a frame echoed."""
    assert tg.t is not None
    started = time.monotonic()
    async with member.open_stream(tg.t.peer_id, [tg.addr]) as s:
        await write_frame(s, b"member")
        assert bytes(await read_frame(s, 1024)) == b"member"
    return time.monotonic() - started


def test_a_strangers_connection_is_closed_right_after_the_handshake() -> None:
    async def body() -> None:
        served: list[str] = []

        async def handler(stream: Stream) -> None:
            served.append(stream.peer_id)
            await echo(stream)

        async with target(handler, max_probation_connections=0) as tg:
            assert tg.t is not None
            async with strangers(tg.t.peer_id, tg.addr, 1) as (s,):
                assert s.conn is not None  # it completed Noise + Yamux
                await s.wait_closed()  # and the target closed it, unasked
                assert tg.refused == [s.peer_id]
            # A stranger that is a whole libp2p host and opens a stream at once gets no
            # session either: its stream dies with the connection.
            outsider_key = Ed25519PrivateKey.generate()
            async with host(key=outsider_key) as outsider:
                try:
                    async with outsider.open_stream(tg.t.peer_id, [tg.addr]) as st:
                        await write_frame(st, b"let me in")
                        await read_frame(st, 1024)
                    raise AssertionError("a stranger's stream was served")
                except TransportError:
                    pass
                await tg.until(lambda: len(tg.refused) == 2)
                assert tg.refused[1] == node_id_of(outsider_key)
            assert served == []
            assert tg.t.refused_connections == 2
            # A member is let in and stays connected.
            member_key = Ed25519PrivateKey.generate()
            tg.members.add(node_id_of(member_key))
            async with host(key=member_key) as member:
                await exchange(member, tg)
                assert tg.t.is_connected(member.peer_id)
                assert served == [member.peer_id]
            assert tg.t.refused_connections == 2

    run(body, TEST_DEADLINE_S)


def test_300_strangers_held_open_do_not_lock_a_member_out() -> None:
    # The issue's done-when: "with 300 stranger connections held open, a member still
    # connects and syncs within one gossip interval". Before mend 8, 256 of them held every
    # inbound slot and the member's dial failed at once.
    async def body() -> None:
        # Probation long enough that no held slot expires before the 296 refusals are
        # counted: at 2 s, a loaded machine (the full suite beside a soak) once took longer,
        # and a slot had already ended when the count was read (3, not 4).
        async with target(probation_s=6.0) as tg:
            assert tg.t is not None
            async with strangers(tg.t.peer_id, tg.addr, FLOOD) as flood:
                assert all(s.conn is not None for s in flood), [s.error for s in flood]
                # All but the probation slots are closed right after their handshakes.
                at_once = FLOOD - MAX_PROBATION_CONNECTIONS
                await tg.until(lambda: len(tg.refused) >= at_once)
                assert tg.t.probation_count() == MAX_PROBATION_CONNECTIONS
                member_key = Ed25519PrivateKey.generate()
                tg.members.add(node_id_of(member_key))
                async with host(key=member_key) as member:
                    took = await exchange(member, tg)
                    assert took < GOSSIP_INTERVAL_S, f"{took:.2f} s"
                    # Probation ends with no session: those are closed too, and counted.
                    await tg.until(lambda: len(tg.refused) == FLOOD)
                    assert tg.t.probation_count() == 0
                    await tg.until(lambda: tg.t is not None
                                   and tg.t.connected_peers() == [member.peer_id])
                    with trio.fail_after(10):
                        for s in flood:
                            await s.wait_closed()
                    assert sorted(tg.refused) == sorted(s.peer_id for s in flood)
                    # Still in, after all of it.
                    assert await exchange(member, tg) < GOSSIP_INTERVAL_S

    run(body, TEST_DEADLINE_S)


@pytest.mark.parametrize("limit", [
    16,  # the limit lowered, so that CI holds 16 connections, not 256 (~30 s)
    pytest.param(LIBP2P_INBOUND_LIMIT, marks=pytest.mark.slow),
])
def test_admitted_peers_bypass_the_libp2p_connection_limits(limit: int) -> None:
    # The reserve: even while outsiders hold every slot py-libp2p allows (here they are
    # all let stay on probation), a member still gets in.
    flood_size = limit + limit // 6

    async def body() -> None:
        async with target(max_probation_connections=10_000, probation_s=120.0) as tg:
            assert tg.t is not None
            limits = tg.t._host.get_network()._resource_manager.connection_limits  # type: ignore[attr-defined]
            assert limits.max_established_inbound == LIBP2P_INBOUND_LIMIT  # py-libp2p's own
            limits.max_established_inbound = limit
            async with strangers(tg.t.peer_id, tg.addr, flood_size) as flood:
                await tg.until(lambda: tg.t is not None and tg.t.probation_count() == limit)
                # The ones over the limit were refused by py-libp2p itself (before they
                # counted as connected: no event but their own connection's end).
                held = set(tg.t.connected_peers())
                assert len(held) == limit
                for s in flood:
                    if s.peer_id not in held:
                        await s.wait_closed()
                member_key = Ed25519PrivateKey.generate()
                tg.members.add(node_id_of(member_key))
                async with host(key=member_key) as member:
                    assert await exchange(member, tg) < GOSSIP_INTERVAL_S
                    assert tg.t.is_connected(member.peer_id)
                assert sum(1 for s in flood if not s.closed_by_target) == limit

    run(body, TEST_DEADLINE_S)


def test_a_newcomer_admitted_during_its_probation_session_stays_connected() -> None:
    # A node admitted by a manifest the target has not seen brings that manifest in its
    # first session (protocol/session.py); here the handler admits a peer that says so.
    async def body() -> None:
        async def handler(stream: Stream) -> None:
            if bytes(await read_frame(stream, 1024)) == b"my manifest admits me":
                tg.members.add(stream.peer_id)
            await write_frame(stream, b"ok")

        async with target(handler, probation_s=60.0) as tg:
            assert tg.t is not None
            async with host() as newcomer, host() as outsider:
                for peer, says in ((newcomer, b"my manifest admits me"), (outsider, b"hi")):
                    async with peer.open_stream(tg.t.peer_id, [tg.addr]) as s:
                        await write_frame(s, says)
                        assert bytes(await read_frame(s, 1024)) == b"ok"
                # The outsider's session is over and did not admit it: closed at once, not
                # at the end of the 60 s probation (its session was counted by the session
                # layer, so not again here).
                await tg.until(lambda: outsider.peer_id in tg.disconnected)
                assert tg.t.refused_connections == 0
                assert tg.t.probation_count() == 0
                assert tg.t.is_connected(newcomer.peer_id)
                async with newcomer.open_stream(tg.t.peer_id, [tg.addr]) as s:
                    await write_frame(s, b"again")
                    assert bytes(await read_frame(s, 1024)) == b"ok"
                assert newcomer.peer_id not in tg.disconnected

    run(body, TEST_DEADLINE_S)


def test_a_revoked_members_open_connection_is_closed_on_recheck() -> None:
    # Admission is judged when a connection opens; a member revoked by a manifest adopted
    # later kept its connection until close_unadmitted (the daemon calls it on adoption).
    async def body() -> None:
        async with target() as tg:
            assert tg.t is not None
            member_key, other_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
            tg.members |= {node_id_of(member_key), node_id_of(other_key)}
            async with host(key=member_key) as member, host(key=other_key) as other:
                await exchange(member, tg)
                await exchange(other, tg)
                assert tg.t.close_unadmitted() == 0  # both still members: nothing cut
                assert tg.t.is_connected(member.peer_id)
                tg.members.discard(member.peer_id)  # the new manifest revokes it
                assert tg.t.close_unadmitted() == 1
                t = tg.t
                await tg.until(lambda: not t.is_connected(member.peer_id))
                assert member.peer_id in tg.disconnected
                assert tg.t.is_connected(other.peer_id)  # the others' stay open
                await exchange(other, tg)

    run(body, TEST_DEADLINE_S)


def test_a_refused_peer_lingering_gets_no_second_session() -> None:
    """Issue 27: while a refused stranger's connection lingers (it reads the refusal), a
    stream it opens is refused, not served as another probation session; an admitted
    peer's probation does not linger."""

    async def body() -> None:
        closed: list[object] = []

        async def close(conn: object) -> None:
            closed.append(conn)

        members: set[str] = set()
        adm = Admission(members.__contains__, None, max_probation=4, probation_s=10,
                        close=close)
        async with trio.open_nursery() as tasks:
            adm.tasks = tasks
            assert adm.screen("conn-s", "stranger")
            assert adm.screen("conn-n", "newcomer")
            stranger, newcomer = adm.session_started("conn-s"), adm.session_started("conn-n")
            members.add("newcomer")  # its session brought the manifest that admits it
            assert adm.lingers(stranger)
            assert not adm.lingers(newcomer)
            assert not adm.lingers(None)  # not on probation: an admitted peer's stream
            assert not adm.screen("conn-s", "stranger")  # no second session meanwhile
            assert adm.screen("conn-n", "newcomer")
            assert closed == []  # the connection goes when the session ends, not before
            Admission.session_ended(stranger)
            Admission.session_ended(newcomer)
            await trio.testing.wait_all_tasks_blocked()
            assert closed == ["conn-s"]
            assert adm.refused == 0  # counted by the session that refused it
            tasks.cancel_scope.cancel()

    run(body)
