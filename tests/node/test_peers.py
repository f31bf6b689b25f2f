"""The peer table: learning of peers, forgetting them, reserving dials, session outcomes.
Pure: times are numbers passed in, nothing is dialled."""

from __future__ import annotations

from peerd.node.peers import MAX_ERROR_LEN, PEER_FORGET_S, Peer, PeerTable

SELF = "12D3KooWself"
T0 = 1_800_000_000.0


def ids(peers: list[Peer]) -> list[str]:
    return [p.id for p in peers]


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
    peer = table.begin_session("12D3KooWin", T0)
    assert (peer.source, peer.addrs, peer.in_session) == ("inbound", (), True)
    PeerTable.release(peer)
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
    peer = table.begin_session("12D3KooWa", T0 + 1)  # it dialled us first
    assert table.due(T0 + 2) == []
    PeerTable.release(peer)
    assert table.due(T0 + 3) == [peer]


def test_unseen_peers_are_forgotten_except_static_ones() -> None:
    table = PeerTable(SELF)
    table.on_hint("12D3KooWold", ["/ip4/10.0.0.2/tcp/4011"], T0)
    table.add_static(["/ip4/10.0.0.3/tcp/4011/p2p/12D3KooWs"], T0)
    PeerTable.release(table.begin_session("12D3KooWin", T0))
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
    peer = table.begin_session("12D3KooWa", T0 + 1)
    PeerTable.failed(peer, "connection refused")
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
    peer = table.begin_session("12D3KooWa", T0)
    PeerTable.failed(peer, "x" * 10_000)
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
