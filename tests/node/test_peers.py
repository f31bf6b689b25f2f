"""The peer table: learning of peers, forgetting them, reserving dials, session outcomes,
backoff and the bound. Pure: times are numbers passed in, nothing is dialled."""

from __future__ import annotations

import itertools
import random

import pytest

from peerd.node.peers import (
    BACKOFF_BASE_S,
    BACKOFF_MAX_S,
    BACKOFF_MEMBER_MAX_S,
    MAX_ERROR_LEN,
    MAX_PEERS,
    PEER_FORGET_S,
    Peer,
    PeerTable,
    backoff_s,
)

SELF = "12D3KooWself"
T0 = 1_800_000_000.0


def ids(peers: list[Peer]) -> list[str]:
    return [p.id for p in peers]


def backoff(peer: Peer) -> tuple[int, float | None]:
    return peer.failures, peer.retry_at


def test_a_hint_adds_an_mdns_peer_once_and_refreshes_it() -> None:
    table = PeerTable(SELF)
    assert table.on_hint("12D3KooWa", ["/ip4/10.0.0.2/tcp/4011"], T0) is True
    assert table.on_hint("12D3KooWa", ["/ip4/10.0.0.9/tcp/4011"], T0 + 5) is False  # moved
    peer = table.get("12D3KooWa")
    assert peer == Peer("12D3KooWa", ("/ip4/10.0.0.9/tcp/4011",), T0 + 5, "mdns")
    assert len(table) == 1
    assert "12D3KooWa" in table
    assert table.ids() == {"12D3KooWa"}


def test_our_own_records_and_static_entries_are_not_peers() -> None:
    table = PeerTable(SELF)
    assert table.on_hint(SELF, ["/ip4/10.0.0.1/tcp/4011"], T0) is False
    table.add_static([f"/ip4/10.0.0.1/tcp/4011/p2p/{SELF}", "/ip4/10.0.0.2/tcp/4011/p2p/",
                      "/ip4/10.0.0.3/tcp/4011/p2p/12D3KooWs"], T0)
    assert table.ids() == {"12D3KooWs"}
    static = table.get("12D3KooWs")
    assert static is not None
    assert (static.addrs, static.source) == (("/ip4/10.0.0.3/tcp/4011",), "static")


def test_an_inbound_peer_becomes_mdns_once_it_is_heard_of() -> None:
    table = PeerTable(SELF)
    peer = table.add_inbound("12D3KooWin", T0)
    assert peer is not None
    assert (peer.source, peer.addrs, peer.in_session) == ("inbound", (), False)
    assert table.due(T0 + 1) == []  # nowhere to dial it
    assert table.on_hint("12D3KooWin", ["/ip4/10.0.0.4/tcp/4011"], T0 + 2) is False
    assert (peer.source, peer.addrs) == ("mdns", ("/ip4/10.0.0.4/tcp/4011",))
    assert table.due(T0 + 3) == [peer]


def test_due_reserves_each_dialable_peer_once_until_released() -> None:
    table = PeerTable(SELF)
    table.on_hint("12D3KooWa", ["/ip4/10.0.0.2/tcp/4011"], T0)
    table.add_static(["/ip4/10.0.0.3/tcp/4011/p2p/12D3KooWb"], T0)
    first = table.due(T0 + 1)
    assert ids(first) == ["12D3KooWa", "12D3KooWb"]
    assert all(p.in_session for p in first)
    assert table.due(T0 + 2) == []  # a second sweep while the dials run starts nothing
    PeerTable.release(first[0])
    assert ids(table.due(T0 + 3)) == ["12D3KooWa"]


def test_a_peer_in_an_inbound_session_is_not_dialled() -> None:
    table = PeerTable(SELF)
    table.on_hint("12D3KooWa", ["/ip4/10.0.0.2/tcp/4011"], T0)
    peer = table.begin_session("12D3KooWa")  # it dialled us first
    assert peer is not None
    assert table.due(T0 + 2) == []
    PeerTable.release(peer)
    assert table.due(T0 + 3) == [peer]


def test_unseen_peers_are_forgotten_except_static_ones() -> None:
    table = PeerTable(SELF)
    table.on_hint("12D3KooWold", ["/ip4/10.0.0.2/tcp/4011"], T0)
    table.add_static(["/ip4/10.0.0.3/tcp/4011/p2p/12D3KooWs"], T0)
    table.add_inbound("12D3KooWin", T0)
    table.on_hint("12D3KooWnew", ["/ip4/10.0.0.5/tcp/4011"], T0 + PEER_FORGET_S)
    # Exactly PEER_FORGET_S unseen is still kept; a moment more is not.
    assert table.ids() == {"12D3KooWold", "12D3KooWs", "12D3KooWin", "12D3KooWnew"}
    for p in table.due(T0 + PEER_FORGET_S):
        PeerTable.release(p)
    assert table.ids() == {"12D3KooWold", "12D3KooWs", "12D3KooWin", "12D3KooWnew"}
    due = table.due(T0 + PEER_FORGET_S + 1)
    assert table.ids() == {"12D3KooWs", "12D3KooWnew"}
    assert ids(due) == ["12D3KooWs", "12D3KooWnew"]
    # A forgotten peer heard of again is a new peer (the caller wakes the gossip loop).
    assert table.on_hint("12D3KooWold", ["/ip4/10.0.0.2/tcp/4011"], T0 + PEER_FORGET_S + 2)


def test_a_completed_session_counts_and_refreshes_the_peer() -> None:
    table = PeerTable(SELF)
    table.on_hint("12D3KooWa", ["/ip4/10.0.0.2/tcp/4011"], T0)
    peer = table.begin_session("12D3KooWa")
    assert peer is not None
    table.failed(peer, "connection refused", T0 + 1)
    PeerTable.completed(peer, T0 + 9, "bad_signature, not_member")
    assert (peer.sessions, peer.last_seen, peer.last_error) == (
        1, T0 + 9, "bad_signature, not_member")
    PeerTable.completed(peer, T0 + 20)
    assert (peer.sessions, peer.last_error) == (2, None)  # a clean session clears the error
    # The refresh keeps it from being forgotten.
    PeerTable.release(peer)
    assert table.due(T0 + 20 + PEER_FORGET_S) == [peer]


def test_a_failure_is_kept_short() -> None:
    table = PeerTable(SELF)
    peer = table.add_inbound("12D3KooWa", T0)
    assert peer is not None
    table.failed(peer, "x" * 10_000, T0 + 1)
    assert peer.last_error == "x" * MAX_ERROR_LEN
    assert peer.sessions == 0
    assert peer.last_seen == T0  # a failure is no sign of life


def test_a_static_entry_replaces_what_was_known() -> None:
    # Configured addresses win over a discovery record: the operator said where it lives.
    table = PeerTable(SELF)
    table.on_hint("12D3KooWs", ["/ip4/10.0.0.2/tcp/4011"], T0)
    table.add_static(["/ip4/10.0.0.3/tcp/4011/p2p/12D3KooWs"], T0 + 1)
    peer = table.get("12D3KooWs")
    assert peer is not None
    assert peer.source == "static"
    assert peer.addrs == ("/ip4/10.0.0.3/tcp/4011",)
    assert [p.id for p in table] == ["12D3KooWs"]


# ---------------------------------------------------------------------------- strangers


def test_a_session_with_an_unknown_peer_enters_nothing() -> None:
    # Issue 12, items 7 and 12: a peer that dialled us is entered only once its session
    # proved it a member (add_inbound, called by the daemon after the session), never at its
    # start: 512 outsiders left 514 peers in the table before.
    table = PeerTable(SELF)
    for i in range(512):
        assert table.begin_session(f"12D3KooWstranger{i}") is None
    assert len(table) == 0
    member = table.add_inbound("12D3KooWmember", T0)
    assert member is not None
    assert table.add_inbound("12D3KooWmember", T0 + 1) is member  # known: the same entry
    assert table.ids() == {"12D3KooWmember"}
    assert table.add_inbound(SELF, T0) is None


# ---------------------------------------------------------------------------- backoff


def test_the_backoff_doubles_from_the_base_up_to_the_cap_with_jitter() -> None:
    rng = random.Random(7)
    for failures in range(1, 40):
        nominal = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (failures - 1))
        for _ in range(50):
            assert nominal / 2 <= backoff_s(failures, rng) <= nominal
    # The jitter spreads peers refused together (no two of 20 draws alike).
    assert len({backoff_s(3, rng) for _ in range(20)}) == 20
    assert backoff_s(10**9, rng) <= BACKOFF_MAX_S  # no overflow for a peer down for ages


def test_a_refused_static_peer_is_not_redialled_every_sweep() -> None:
    # Issue 12, item 8: a non-member in static_peers was dialled every ~3 s, forever (40
    # refused sessions in 3 minutes). Sweep every 3 s for 3 minutes and an hour.
    table = PeerTable(SELF, rng=random.Random(1))
    table.add_static(["/ip4/10.0.0.3/tcp/4011/p2p/12D3KooWout"], T0)
    dials: list[float] = []

    def sweep_for(seconds: float, start: float) -> None:
        t = start
        while t < start + seconds:
            for peer in table.due(t):
                dials.append(t)
                table.failed(peer, "refused: not_member", t)
                PeerTable.release(peer)
            t += 3.0

    sweep_for(180.0, T0)
    assert 4 <= len(dials) <= 8  # 5 s, 10 s, 20 s, 40 s, 80 s (jittered) after the first
    gaps = [b - a for a, b in itertools.pairwise(dials)]
    assert gaps == sorted(gaps)  # growing
    dials.clear()
    sweep_for(3600.0, T0 + 1800.0)
    # Capped: one attempt every 150-300 s, so 12-24 an hour, never one per sweep.
    assert 12 <= len(dials) <= 25
    peer = table.get("12D3KooWout")
    assert peer is not None
    assert peer.failures > 10
    assert peer.source == "static"  # refused, backed off, but the operator's entry stays


def test_a_good_session_resets_the_backoff() -> None:
    table = PeerTable(SELF, rng=random.Random(2))
    table.on_hint("12D3KooWa", ["/ip4/10.0.0.2/tcp/4011"], T0)
    (peer,) = table.due(T0)
    for i in range(6):
        table.failed(peer, "connection refused", T0 + i)
    assert peer.failures == 6
    assert peer.retry_at is not None
    assert peer.retry_at >= T0 + 5 + BACKOFF_BASE_S * 2**5 / 2
    PeerTable.release(peer)
    assert table.due(T0 + 10) == []  # backing off
    # It dialled us meanwhile and the session went well (the daemon reports it so).
    assert table.begin_session("12D3KooWa") is peer
    PeerTable.completed(peer, T0 + 11)
    PeerTable.release(peer)
    assert backoff(peer) == (0, None)
    assert peer.last_error is None
    assert table.due(T0 + 11) == [peer]  # due at once again
    # The next failure starts from the base again.
    table.failed(peer, "timeout", T0 + 12)
    assert peer.retry_at is not None
    assert T0 + 12 + BACKOFF_BASE_S / 2 <= peer.retry_at <= T0 + 12 + BACKOFF_BASE_S


def test_a_proven_member_cut_off_by_a_partition_is_retried_within_seconds() -> None:
    # The soak (docs/reliability.md): after a 30 s partition the mesh took 27 s (median) to
    # re-converge, because members that could not reach each other had backed off to 20-40 s
    # and nothing announces that the path is back. A member that completed a session before
    # and is merely unreachable waits at most BACKOFF_MEMBER_MAX_S, however long it was away.
    table = PeerTable(SELF, rng=random.Random(3))
    table.on_hint("12D3KooWa", ["/ip4/10.0.0.2/tcp/4011"], T0)
    (peer,) = table.due(T0)
    PeerTable.completed(peer, T0)  # a member: it has been talked to
    PeerTable.release(peer)
    t, waits = T0 + 1, []
    for _ in range(12):  # a minute of failed dials (the partition)
        table.failed(peer, "connection refused", t)
        assert peer.retry_at is not None
        waits.append(peer.retry_at - t)
        t = peer.retry_at
    assert max(waits) <= BACKOFF_MEMBER_MAX_S
    assert min(waits) >= BACKOFF_MEMBER_MAX_S / 2  # still backed off (jitter), not 0
    assert peer.failures == 12
    # A refusal (it was revoked, say) still gets the full schedule.
    for _ in range(6):
        table.failed(peer, "refused: revoked", t, refused=True)
    assert peer.retry_at is not None
    assert peer.retry_at - t >= BACKOFF_MAX_S / 2


def test_a_never_proven_unreachable_peer_keeps_the_full_schedule() -> None:
    table = PeerTable(SELF, rng=random.Random(4))
    table.on_hint("12D3KooWa", ["/ip4/10.0.0.2/tcp/4011"], T0)
    (peer,) = table.due(T0)
    for _ in range(8):
        table.failed(peer, "connection refused", T0)
    assert peer.retry_at is not None
    assert peer.retry_at - T0 >= BACKOFF_MAX_S / 2


def test_a_new_address_is_tried_at_once_despite_the_backoff() -> None:
    table = PeerTable(SELF)
    table.on_hint("12D3KooWa", ["/ip4/10.0.0.2/tcp/4011"], T0)
    (peer,) = table.due(T0)
    table.failed(peer, "connection refused", T0)
    PeerTable.release(peer)
    table.on_hint("12D3KooWa", ["/ip4/10.0.0.2/tcp/4011"], T0 + 1)  # same record again
    assert table.due(T0 + 1) == []
    table.on_hint("12D3KooWa", ["/ip4/10.0.0.2/tcp/4099"], T0 + 2)  # restarted elsewhere
    assert table.due(T0 + 2) == [peer]
    assert peer.failures == 1  # the count stays until a session succeeds


# ---------------------------------------------------------------------------- goodbyes


def test_a_goodbye_forgets_an_mdns_peer_but_not_a_static_or_inbound_one() -> None:
    table = PeerTable(SELF)
    table.on_hint("12D3KooWm", ["/ip4/10.0.0.2/tcp/4011"], T0)
    table.add_static(["/ip4/10.0.0.3/tcp/4011/p2p/12D3KooWs"], T0)
    table.add_inbound("12D3KooWin", T0)
    assert table.on_lost("12D3KooWm") is True
    assert table.on_lost("12D3KooWs") is False
    assert table.on_lost("12D3KooWin") is False
    assert table.on_lost("12D3KooWnever") is False
    assert table.ids() == {"12D3KooWs", "12D3KooWin"}
    assert table.due(T0 + 1) == [table.get("12D3KooWs")]  # nothing dials the departed peer


# ---------------------------------------------------------------------------- the bound


def test_the_table_is_bounded_and_evicts_the_oldest_non_static_peer() -> None:
    table = PeerTable(SELF)
    table.add_static(["/ip4/10.0.0.3/tcp/4011/p2p/12D3KooWs"], T0 - 1000)  # oldest of all
    busy = table.add_inbound("12D3KooWbusy", T0 - 500)
    assert busy is not None
    assert table.begin_session("12D3KooWbusy") is busy  # in a session: kept
    for i in range(MAX_PEERS - 2):
        assert table.on_hint(f"12D3KooWp{i}", ["/ip4/10.0.0.9/tcp/4011"], T0 + i)
    assert len(table) == MAX_PEERS
    # One more: the oldest non-static peer without a session goes, the new one comes in.
    assert table.on_hint("12D3KooWnew", ["/ip4/10.0.0.8/tcp/4011"], T0 + MAX_PEERS)
    assert len(table) == MAX_PEERS
    assert "12D3KooWp0" not in table
    assert {"12D3KooWs", "12D3KooWbusy", "12D3KooWnew", "12D3KooWp1"} <= table.ids()
    assert table.add_inbound("12D3KooWin", T0 + MAX_PEERS + 1) is not None
    assert "12D3KooWp1" not in table
    assert len(table) == MAX_PEERS


@pytest.mark.parametrize("wave", [1, 3])
def test_waves_of_new_names_never_grow_the_table(wave: int) -> None:
    # Issue 12, item 12: goodbye and re-register waves grew the table to 1,331 peers.
    table = PeerTable(SELF)
    t = T0
    for w in range(wave):
        for i in range(1500):
            t += 0.01
            table.on_hint(f"12D3KooWw{w}x{i}", ["/ip4/10.0.0.9/tcp/4011"], t)
        for i in range(0, 1500, 2):
            table.on_lost(f"12D3KooWw{w}x{i}")
        assert len(table) <= MAX_PEERS


def test_a_full_table_of_static_peers_takes_no_more() -> None:
    table = PeerTable(SELF)
    table.add_static([f"/ip4/10.0.0.3/tcp/4011/p2p/12D3KooWs{i}" for i in range(MAX_PEERS)], T0)
    assert len(table) == MAX_PEERS
    assert table.on_hint("12D3KooWm", ["/ip4/10.0.0.2/tcp/4011"], T0) is False
    assert table.add_inbound("12D3KooWin", T0) is None
    assert all(p.source == "static" for p in table)


def _mesh_table(n: int) -> PeerTable:
    table = PeerTable(SELF, rng=random.Random(7))
    for i in range(n):
        table.on_hint(f"12D3KooWp{i:02d}", [f"/ip4/10.0.0.{i + 2}/tcp/4011"], T0)
    return table


def test_a_bounded_sweep_reserves_at_most_fanout_peers() -> None:
    table = _mesh_table(10)
    first = table.due(T0 + 1, fanout=3)
    assert len(first) == 3
    assert all(p.in_session for p in first)
    # The ones not chosen stay free: the next sweep may pick them while these still run.
    second = table.due(T0 + 2, fanout=3)
    assert len(second) == 3
    assert not set(ids(first)) & set(ids(second))
    assert sum(p.in_session for p in table) == 6
    # Fewer candidates than the fanout: all of them.
    assert len(table.due(T0 + 3, fanout=5)) == 4
    assert table.due(T0 + 4, fanout=3) == []


def test_a_bounded_sweep_prefers_peers_synchronised_longest_ago() -> None:
    table = _mesh_table(6)
    # p00..p03 synchronised at T0 + 10 + i; p04 and p05 never: those two come first, then
    # the oldest sessions.
    for i in range(4):
        peer = table.get(f"12D3KooWp{i:02d}")
        assert peer is not None
        PeerTable.completed(peer, T0 + 10 + i)
    chosen = table.due(T0 + 20, fanout=3)
    assert set(ids(chosen)) == {"12D3KooWp04", "12D3KooWp05", "12D3KooWp00"}


def test_bounded_sweeps_reach_every_peer_in_turn() -> None:
    """Anti-entropy: with sessions completing, every peer is dialled within
    ceil(n / fanout) sweeps and none twice before all had a turn."""
    n, fanout = 10, 3
    table = _mesh_table(n)
    seen: list[str] = []
    for sweep in range(4):  # ceil(10 / 3)
        now = T0 + 1 + sweep
        for peer in table.due(now, fanout=fanout):
            seen.append(peer.id)
            PeerTable.completed(peer, now)
            PeerTable.release(peer)
    assert len(set(seen[:n])) == n  # the first n dials: each peer once, then it repeats


def test_bounded_sweeps_pick_in_a_random_order_among_equals() -> None:
    orders = set()
    for seed in range(5):
        table = PeerTable(SELF, rng=random.Random(seed))
        for i in range(8):
            table.on_hint(f"12D3KooWp{i}", [f"/ip4/10.0.0.{i + 2}/tcp/4011"], T0)
        orders.add(tuple(sorted(ids(table.due(T0 + 1, fanout=2)))))
    assert len(orders) > 1  # not always the first-inserted peers


def test_idle_connections_beyond_the_bound_are_the_least_recently_synchronised() -> None:
    table = _mesh_table(6)
    for i in range(6):
        peer = table.get(f"12D3KooWp{i:02d}")
        assert peer is not None
        PeerTable.completed(peer, T0 + 10 + i)
    busy = table.begin_session("12D3KooWp00")  # oldest, but in a session: never closed
    assert busy is not None
    connected = [f"12D3KooWp{i:02d}" for i in range(6)] + ["12D3KooWstranger"]
    assert table.idle_connected(connected, keep=6) == []
    assert table.idle_connected(connected, keep=4) == ["12D3KooWp01", "12D3KooWp02"]
    PeerTable.release(busy)
    assert table.idle_connected(connected, keep=4) == ["12D3KooWp00", "12D3KooWp01"]
    # Never synchronised (it dialled us and failed, say) counts as the oldest.
    table.on_hint("12D3KooWnew", ["/ip4/10.0.1.1/tcp/4011"], T0 + 30)
    assert table.idle_connected([*connected, "12D3KooWnew"], keep=6) == ["12D3KooWnew"]
