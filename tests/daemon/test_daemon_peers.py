"""The daemon's side of the peer table (issue 12, items 7, 8 and 12): who enters it after a
session, who is refused and backed off, what discovery and the transport are told to let
in, and how a connection closed without a session is counted. A real ``Daemon`` object
(not run: no sockets), with a fleet of three members, one revoked, and strangers."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.daemon.daemon import Daemon
from peerd.net.gossip import SessionResult
from peerd.net.transport import StreamLimitError, TransportError, TransportTimeoutError
from peerd.node.peers import Peer, PeerTable
from peerd.protocol import messages as msg
from tests.daemon.helpers import fleet_config

runner = CliRunner(env={"COLUMNS": "200"})
STRANGER = "12D3KooWHrSJFRHKPKfFrEJFS3wxJZoR6V95nzTRkHsnQ1MxDjz4"


def _keygen(state: Path) -> str:
    out = runner.invoke(app, ["keygen", "--state-dir", str(state)])
    assert out.exit_code == 0, out.output
    match = re.search(r"12D3KooW\w+", out.stdout)
    assert match is not None
    return match.group(0)


def _daemon(tmp_path: Path, *, with_manifest: bool = True) -> tuple[Daemon, str, str]:
    """(daemon, a member's id, a revoked member's id)."""
    fleet = tmp_path / "fleet"
    assert runner.invoke(app, ["fleet", "init", str(fleet)]).exit_code == 0
    state = tmp_path / "st"
    ids = [_keygen(state), _keygen(tmp_path / "m"), _keygen(tmp_path / "r")]
    for node_id in ids:
        assert runner.invoke(app, ["fleet", "admit", "--fleet", str(fleet), node_id]).exit_code == 0
    assert runner.invoke(app, ["fleet", "revoke", "--fleet", str(fleet), ids[2]]).exit_code == 0
    cfg = fleet_config(tmp_path, fleet, state, with_manifest=with_manifest)
    return Daemon(cfg), ids[1], ids[2]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Daemon, str, str]:
    return _daemon(tmp_path_factory.mktemp("fleet"))


def test_only_members_are_admitted_and_discovered(fleet: tuple[Daemon, str, str]) -> None:
    daemon, member, revoked = fleet
    assert daemon._admits(member)
    assert daemon._may_be_member(member)
    for outsider in (STRANGER, revoked):
        assert not daemon._admits(outsider)
        assert not daemon._may_be_member(outsider)
    assert daemon._member_refusal(STRANGER) == "not_member"
    assert daemon._member_refusal(revoked) == "revoked"


def test_a_stranger_whose_session_ran_is_not_entered(fleet: tuple[Daemon, str, str]) -> None:
    # Issue 12, item 7: before, begin_session entered every peer that dialled in, as
    # "inbound", before the membership check; 512 outsiders left 514 peers in the table.
    daemon, member, _ = fleet
    now = daemon.now()
    for i in range(3):
        assert daemon.peers.begin_session(STRANGER) is None
        daemon._session_outcome(None, STRANGER, now + i, "not_member")
    assert STRANGER not in daemon.peers
    # A member that dialled in unannounced is entered once its session proved it.
    assert daemon.peers.begin_session(member) is None
    daemon._session_outcome(None, member, now, None)
    peer = daemon.peers.get(member)
    assert peer is not None
    assert (peer.source, peer.sessions, peer.failures) == ("inbound", 1, 0)


def test_a_refused_peer_is_backed_off_and_forgotten_unless_static(
    fleet: tuple[Daemon, str, str],
) -> None:
    daemon, _, revoked = fleet
    now = daemon.now()
    # Known from mDNS before its revocation reached us: refused, backed off, forgotten.
    daemon.peers.on_hint(revoked, ["/ip4/10.0.0.9/tcp/4011"], now)
    peer = daemon.peers.begin_session(revoked)
    assert peer is not None
    daemon._session_outcome(peer, revoked, now, "revoked")
    assert (peer.failures, peer.last_error) == (1, "refused: revoked")
    assert revoked not in daemon.peers
    # In static_peers (item 8): it stays, the operator put it there, but is backed off.
    daemon.peers.add_static([f"/ip4/10.0.0.8/tcp/4011/p2p/{STRANGER}"], now)
    static = daemon.peers.get(STRANGER)
    assert static is not None
    assert daemon.peers.begin_session(STRANGER) is static
    daemon._session_outcome(static, STRANGER, now, "not_member")
    PeerTable.release(static)
    assert STRANGER in daemon.peers
    assert static.failures == 1
    assert static.retry_at is not None
    assert static not in daemon.peers.due(now + 1)  # backing off, not dialled next sweep
    assert static in daemon.peers.due(static.retry_at)


def test_a_connection_closed_without_a_session_is_counted_by_reason(
    fleet: tuple[Daemon, str, str],
) -> None:
    daemon, _, revoked = fleet
    before = dict(daemon.node.rejected)
    daemon._refused_connection(STRANGER)
    daemon._refused_connection(STRANGER)
    daemon._refused_connection(revoked)
    assert daemon.node.rejected["not_member"] == before.get("not_member", 0) + 2
    assert daemon.node.rejected["revoked"] == before.get("revoked", 0) + 1
    assert not any(e["event"] == "refused" for e in daemon.state.read_audit())


def test_without_a_manifest_every_record_counts_but_nobody_is_admitted(tmp_path: Path) -> None:
    # A node still waiting for its first manifest cannot tell members: discovery takes
    # every record of the fleet (the table is bounded), while the transport admits nobody,
    # so strangers only ever get a session on probation, in which a member brings the
    # manifest.
    daemon, member, _ = _daemon(tmp_path, with_manifest=False)
    assert daemon.node.manifest_envelope is None
    assert daemon._may_be_member(STRANGER)
    assert daemon._may_be_member(member)
    assert not daemon._admits(STRANGER)
    assert not daemon._admits(member)


def test_adopting_a_manifest_closes_the_connections_it_no_longer_admits(
        fleet: tuple[Daemon, str, str]) -> None:
    # Admission is judged when a connection opens: a member that a newly adopted manifest
    # revokes would keep its open connection, so the daemon has the transport recheck them.
    daemon, _, _ = fleet

    class Transport:
        rechecks = 0

        def close_unadmitted(self) -> int:
            self.rechecks += 1
            return 0

    transport = Transport()
    daemon.transport = transport  # type: ignore[assignment]
    try:
        envelope = daemon.node.manifest_envelope
        assert envelope is not None
        daemon._session_ctx().on_manifest(msg.ManifestMessage(envelope))
    finally:
        daemon.transport = None
    assert transport.rechecks == 1


def test_inbound_sessions_beyond_the_bound_are_refused_busy(tmp_path: Path) -> None:
    daemon, member, _ = _daemon(tmp_path)
    bound = daemon.cfg.network.max_inbound_sessions

    class Stream:
        peer_id = member
        resets = 0

        async def reset(self) -> None:
            self.resets += 1

    stream = Stream()
    daemon._inbound_sessions = bound  # that many run already
    trio.run(daemon._inbound, stream)
    assert (stream.resets, daemon.busy_refusals, daemon._inbound_sessions) == (1, 1, bound)


def test_idle_connections_beyond_max_connections_are_closed_oldest_first(
        tmp_path: Path) -> None:
    daemon, member, _ = _daemon(tmp_path)
    keep = daemon.cfg.network.max_connections
    ids = [member] + [f"12D3KooWpeer{i:03d}" for i in range(keep + 2)]
    for i, peer_id in enumerate(ids):
        daemon.peers.on_hint(peer_id, [f"/ip4/10.0.{i // 250}.{i % 250 + 1}/tcp/4011"], 0.0)
        peer = daemon.peers.get(peer_id)
        assert peer is not None
        PeerTable.completed(peer, 100.0 + i)

    class Transport:
        def __init__(self) -> None:
            self.closed: list[str] = []

        def connected_peers(self) -> list[str]:
            return [p for p in ids if p not in self.closed] + [STRANGER]

        async def disconnect(self, peer_id: str) -> None:
            self.closed.append(peer_id)

    transport = Transport()
    daemon.transport = transport  # type: ignore[assignment]
    try:
        trio.run(daemon._trim_connections)
        assert transport.closed == ids[:3]  # the three synchronised longest ago
        trio.run(daemon._trim_connections)
        assert transport.closed == ids[:3]  # at the bound now: nothing more
    finally:
        daemon.transport = None


def test_an_inbound_session_that_ends_leaves_our_dial_reserved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 14, item 3: 32 daemons showed a node running 32 of its own sessions at once with
    # 31 peers: an inbound session freed the peer our dial still held, and it was dialled again.
    daemon, member, _ = _daemon(tmp_path)
    daemon.peers.on_hint(member, ["/ip4/10.0.0.2/tcp/4011"], daemon.now())
    (dialled,) = daemon.peers.due(daemon.now(), fanout=3)  # our sweep reserves it
    assert dialled.id == member

    async def session(*_args: object, **_kwargs: object) -> SessionResult:
        return SessionResult(peer=member)

    monkeypatch.setattr("peerd.daemon.gossiping.run_session", session)

    class Stream:
        peer_id = member

    def reserved() -> bool:  # read afresh each time (sessions change it behind our back)
        return dialled.in_session

    trio.run(daemon._inbound, Stream())  # the member dialled us too; its session ends first
    assert reserved()
    assert dialled.sessions == 1
    assert daemon.peers.due(daemon.now(), fanout=3) == []  # not dialled a second time
    PeerTable.release(dialled)  # our dial ends
    assert not reserved()
    trio.run(daemon._inbound, Stream())  # an inbound session alone reserves and frees it
    assert not reserved()
    assert dialled.sessions == 2


def test_at_most_fanout_own_sessions_run_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 14, item 3: the fanout bounded what one sweep started, but every discovery and
    # publish wakes the loop, so slow sessions piled up (31 at once in a fleet of 32).
    daemon, _, _ = _daemon(tmp_path)
    for i in range(6):
        daemon.peers.on_hint(f"peer-{i}", [f"/ip4/10.0.0.{i + 2}/tcp/4011"], daemon.now())
    finish = trio.Event()
    dialled: list[str] = []

    async def slow_dial(_transport: object, peer: object) -> None:
        dialled.append(peer.id)  # type: ignore[attr-defined]
        await finish.wait()

    monkeypatch.setattr(daemon, "_dial", slow_dial)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(daemon._gossip_loop, None, nursery)
            for _ in range(5):  # five wake-ups while the first three sessions still run
                await trio.sleep(1)
                daemon._wake_gossip.set()
            assert daemon._outbound_sessions == 3
            assert len(dialled) == 3  # the wake-ups started nothing more
            finish.set()  # the sessions end: the next sweep starts the other three
            await trio.sleep(1)
            daemon._wake_gossip.set()
            await trio.sleep(1)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert daemon.gossip_counts["most_outbound_at_once"] == 3
    assert len(dialled) >= 6  # three, then more once the first three had ended


class _BrokenOnce:
    """A transport whose connection to the peer is up but broken (issue 27: a NAT router
    forgot its mapping): a stream on it fails with ``error``; a fresh dial (after a
    disconnect, or ``connected=False`` from the start) gets a stream, unless ``unreachable``."""

    def __init__(self, error: Exception, *, connected: bool = True,
                 unreachable: bool = False) -> None:
        self.error, self.connected, self.unreachable = error, connected, unreachable
        self.opened: list[bool] = []  # per attempt: whether a connection was up
        self.disconnected = 0

    def is_connected(self, _peer_id: str) -> bool:
        return self.connected

    async def disconnect(self, _peer_id: str) -> None:
        self.connected = False
        self.disconnected += 1

    @asynccontextmanager
    async def open_stream(self, peer_id: str, _addrs: object) -> AsyncIterator[object]:
        self.opened.append(self.connected)
        if self.connected:
            raise self.error
        if self.unreachable:
            raise TransportError(f"dial to {peer_id} failed: refused")
        self.connected = True

        class Stream:
            pass

        yield Stream()


def _dial_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               transport: _BrokenOnce) -> Peer:
    daemon, member, _ = _daemon(tmp_path)
    daemon.peers.on_hint(member, ["/ip4/10.0.0.2/tcp/4011"], daemon.now())
    (peer,) = daemon.peers.due(daemon.now(), fanout=3)

    async def session(*_args: object, **_kwargs: object) -> SessionResult:
        return SessionResult(peer=member)

    monkeypatch.setattr("peerd.daemon.gossiping.run_session", session)
    trio.run(daemon._dial, transport, peer)
    return peer


@pytest.mark.parametrize("error", [TransportError("opening a stream failed: reset"),
                                   TransportTimeoutError("opening a stream timed out")])
def test_a_connection_broken_by_the_network_is_redialled_at_once_not_backed_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    transport = _BrokenOnce(error)
    peer = _dial_with(tmp_path, monkeypatch, transport)
    assert transport.opened == [True, False]  # the old connection, then a fresh dial
    assert transport.disconnected == 1
    assert (peer.sessions, peer.failures, peer.retry_at) == (1, 0, None)


def test_a_failed_fresh_dial_is_backed_off_and_not_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for connected in (True, False):  # after a broken connection, or with none at all
        transport = _BrokenOnce(TransportError("reset"), connected=connected, unreachable=True)
        peer = _dial_with(tmp_path / str(connected), monkeypatch, transport)
        assert transport.opened == ([True, False] if connected else [False])
        assert peer.failures == 1
        assert peer.retry_at is not None


def test_our_own_stream_limit_drops_no_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    transport = _BrokenOnce(StreamLimitError("8 streams open"))
    peer = _dial_with(tmp_path, monkeypatch, transport)
    assert transport.opened == [True]
    assert transport.disconnected == 0
    assert peer.failures == 1
