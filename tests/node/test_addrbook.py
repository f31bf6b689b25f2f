"""The address book (peerd.node.addrbook), its file (peerd.store.addrfile) and the peer
table's bootstrap and exchanged sources (peerd.node.peers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from peerd.core.reasons import Reason
from peerd.node import addrbook
from peerd.node.addrbook import AddressBook, dialable_addrs
from peerd.node.peers import PEER_FORGET_S, PeerTable
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import node_id_of
from peerd.protocol.peerrecord import sign_record
from peerd.store import addrfile
from peerd.store.statedir import StateDir
from tests.protocol.helpers import ALICE, BOB, FLEET, MALLORY, NOW, key

A, B, M = node_id_of(ALICE), node_id_of(BOB), node_id_of(MALLORY)
ADDR = "/ip4/10.0.0.2/tcp/4011"


def everyone(node_id: str) -> bool:
    return True


def rec(k=BOB, seq: int = 1, addrs: tuple[str, ...] = (ADDR,), ttl: float = 3600):  # type: ignore[no-untyped-def]
    return sign_record(k, FLEET, seq=seq, addrs=addrs, expires=NOW + ttl)


def test_only_a_newer_seq_replaces_a_held_record() -> None:
    book = AddressBook(ALICE, FLEET)
    [first] = book.receive([rec(seq=5).envelope], NOW, everyone)
    assert first.new_addrs
    assert book.receive([rec(seq=5, addrs=("/ip4/10.6.6.6/tcp/1",)).envelope], NOW,
                        everyone) == []
    assert book.receive([rec(seq=4, addrs=("/ip4/10.6.6.6/tcp/1",)).envelope], NOW,
                        everyone) == []
    assert book.get(B).addrs == (ADDR,)  # type: ignore[union-attr]
    [moved] = book.receive([rec(seq=6, addrs=("/ip4/10.0.0.3/tcp/1",)).envelope], NOW,
                           everyone)
    assert moved.new_addrs
    assert book.get(B).seq == 6  # type: ignore[union-attr]


def test_non_members_and_expired_records_are_skipped_forged_ones_end_the_exchange() -> None:
    book = AddressBook(ALICE, FLEET)
    assert book.receive([rec(MALLORY).envelope], NOW, lambda n: n != M) == []
    assert book.receive([rec(ttl=10).envelope], NOW + 10, everyone) == []
    assert (len(book), book.skipped) == (0, 2)
    other = rec(MALLORY).envelope
    forged = type(other)(other.fleet_id, other.key, rec().envelope.body, other.sig)
    with pytest.raises(ProtocolError) as err:
        book.receive([forged], NOW, everyone)
    assert err.value.reason == Reason.BAD_SIGNATURE
    assert len(book) == 0


def test_our_own_record_is_never_taken_from_a_peer() -> None:
    book = AddressBook(ALICE, FLEET)
    assert book.receive([rec(ALICE).envelope], NOW, everyone) == []
    assert len(book) == 0


def test_outgoing_is_ours_first_members_only_never_the_peers_own_and_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    book = AddressBook(ALICE, FLEET)
    own = book.sign_own((ADDR,), NOW)
    keys = [key(f"m{i}") for i in range(5)]
    book.receive([rec(k, ttl=100 + i).envelope for i, k in enumerate(keys)], NOW, everyone)
    book.receive([rec(BOB).envelope], NOW, everyone)
    out = book.outgoing(NOW, lambda n: n != node_id_of(keys[0]), exclude=B)
    assert own is not None
    assert out[0] == own.envelope
    # The rest: members, the peer's own left out, those that expire last first.
    assert out[1:] == tuple(book.get(node_id_of(k)).envelope  # type: ignore[union-attr]
                            for k in reversed(keys[1:]))
    monkeypatch.setattr(addrbook, "MAX_ADDR_RECORDS", 3)
    assert len(book.outgoing(NOW, everyone)) == 3


def test_the_book_is_bounded_and_the_record_expiring_first_makes_room(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(addrbook, "MAX_BOOK_ENTRIES", 2)
    book = AddressBook(ALICE, FLEET)
    k1, k2, k3 = key("m1"), key("m2"), key("m3")
    book.receive([rec(k1, ttl=100).envelope, rec(k2, ttl=300).envelope], NOW, everyone)
    assert book.receive([rec(k3, ttl=50).envelope], NOW, everyone) == []  # outlived by both
    book.receive([rec(k3, ttl=200).envelope], NOW, everyone)
    assert {r.node_id for r in book.records()} == {node_id_of(k2), node_id_of(k3)}
    assert book.expire(NOW + 250) == 1
    assert len(book) == 1
    assert book.prune(lambda n: False) == 1
    assert len(book) == 0


def test_our_record_is_kept_while_its_addresses_stay_and_its_seq_never_goes_back() -> None:
    book = AddressBook(ALICE, FLEET)
    assert book.sign_own((), NOW) is None
    first = book.sign_own((ADDR,), NOW)
    assert book.sign_own((ADDR,), NOW + 60) is first
    moved = book.sign_own(("/ip4/10.0.0.9/tcp/4011",), NOW - 3600)  # clock stepped back
    assert first is not None
    assert moved is not None
    assert moved.seq == first.seq + 1
    renewed = book.sign_own(moved.addrs, NOW + addrbook.OWN_RECORD_TTL_S)
    assert renewed is not None
    assert renewed.seq > moved.seq


def test_the_book_survives_a_restart_and_a_tampered_file_plants_nothing(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    book = AddressBook(ALICE, FLEET)
    own = book.sign_own((ADDR,), NOW)
    book.receive([rec(BOB).envelope, rec(key("m1")).envelope], NOW, everyone)
    addrfile.save(state, book)
    again = AddressBook(ALICE, FLEET)
    seq, envelopes = addrfile.load(state)
    assert again.restore(envelopes, seq, NOW, lambda n: n != node_id_of(key("m1"))) == 1
    assert again.get(B) == book.get(B)
    assert own is not None
    assert again.sign_own((ADDR,), NOW).seq > own.seq  # type: ignore[union-attr]
    # A record whose body was edited no longer verifies: it is left out, the rest loads.
    good = rec(BOB).envelope
    edited = type(good)(good.fleet_id, good.key, good.body.replace(b"10.0.0.2", b"10.6.6.6"),
                        good.sig)
    third = AddressBook(ALICE, FLEET)
    assert third.restore([edited, rec(key("m1")).envelope], 0, NOW, everyone) == 1
    state.write_blob(addrfile.ADDRBOOK_BLOB, b"\x93not a book")
    assert addrfile.load(state) == (0, [])


@pytest.mark.parametrize(("listen", "bound", "want"), [
    (["/ip4/127.0.0.1/tcp/1"], "127.0.0.1", ["/ip4/127.0.0.1/tcp/1"]),
    (["/ip4/127.0.0.1/tcp/1", "/ip4/10.0.0.2/tcp/1"], "0.0.0.0", ["/ip4/10.0.0.2/tcp/1"]),
    (["/ip4/0.0.0.0/tcp/1"], "0.0.0.0", []),
    (["/ip6/fe80::1/tcp/1", "/ip6/2001:db8::1/tcp/1"], "::", ["/ip6/2001:db8::1/tcp/1"]),
])
def test_only_dialable_addresses_go_into_our_record(listen: list[str], bound: str,
                                                    want: list[str]) -> None:
    assert list(dialable_addrs(listen, bound)) == want


def test_circuits_follow_the_direct_addresses_and_keep_their_places() -> None:
    relay = node_id_of(key("r"))
    circuits = [f"/ip4/203.0.113.{i}/tcp/4011/p2p/{relay}/p2p-circuit" for i in (7, 8, 9)]
    listen = [f"/ip4/10.0.0.{i}/tcp/4011" for i in range(2, 8)]
    assert dialable_addrs(listen[:1], "0.0.0.0", circuits[:1]) == (listen[0], circuits[0])
    # Many of both: direct ones first, but CIRCUIT_PLACES (2) of the 4 are the circuits'.
    assert dialable_addrs(listen, "0.0.0.0", circuits) == (*listen[:2], *circuits[:2])
    # No direct address (all loopback while bound to 0.0.0.0): the circuits fill the record.
    assert dialable_addrs(["/ip4/127.0.0.1/tcp/1"], "0.0.0.0", circuits) == tuple(circuits)
    assert dialable_addrs(listen[:1], "0.0.0.0", ["/ip4/1.2.3.4/tcp/1/p2p-circuit"]) == \
        (listen[0],)  # a malformed circuit is dropped
    book = AddressBook(ALICE, FLEET)
    own = book.sign_own(dialable_addrs(listen[:1], "0.0.0.0", circuits[:1]), NOW)
    assert own is not None
    assert own.addrs == (listen[0], circuits[0])


# ---------------------------------------------------------------- the peer table's sources
def test_an_exchanged_peer_is_entered_and_an_inbound_one_gets_its_addresses() -> None:
    table = PeerTable(A)
    assert table.on_exchanged(B, (ADDR,), NOW)
    assert table.get(B).source == "exchanged"  # type: ignore[union-attr]
    assert [p.id for p in table.due(NOW)] == [B]
    table.add_inbound(M, NOW)
    assert table.on_exchanged(M, (ADDR,), NOW)
    assert (table.get(M).source, table.get(M).addrs) == ("exchanged", (ADDR,))  # type: ignore[union-attr]
    table.add_static([f"{ADDR}/p2p/{node_id_of(key('s'))}"], NOW)
    assert not table.on_exchanged(node_id_of(key("s")), ("/ip4/10.9.9.9/tcp/1",), NOW)
    assert table.get(node_id_of(key("s"))).addrs == (ADDR,)  # type: ignore[union-attr]


def test_bootstrap_peers_are_kept_like_static_ones_and_retried_when_cut_off() -> None:
    table = PeerTable(A)
    table.add_bootstrap(B, (ADDR,), NOW)
    table.on_exchanged(M, (ADDR,), NOW)
    peer = table.get(B)
    assert peer is not None
    assert peer.source == "bootstrap"
    table.due(NOW)
    PeerTable.release(peer)
    table.failed(peer, "unreachable", NOW)
    assert all(p.id != B for p in table.due(NOW + 1))
    later = NOW + PEER_FORGET_S + 1
    assert not table.reached(later, 60)
    table.retry_bootstrap()
    assert [p.id for p in table.due(later)] == [B]  # the exchanged one was forgotten


def test_records_holding_a_circuit_go_only_to_peers_that_take_them() -> None:
    relay = node_id_of(key("r"))
    circuit = f"/ip4/203.0.113.7/tcp/4011/p2p/{relay}/p2p-circuit"
    book = AddressBook(ALICE, FLEET)
    book.sign_own((ADDR, circuit), NOW)
    plain = sign_record(BOB, FLEET, seq=1, addrs=(ADDR,), expires=NOW + 60)
    relayed = sign_record(MALLORY, FLEET, seq=1, addrs=(circuit,), expires=NOW + 60)
    assert book.offer(plain) is not None
    assert book.offer(relayed) is not None
    assert book.own is not None
    everyone = lambda _: True  # noqa: E731
    assert set(book.outgoing(NOW, everyone)) == {book.own.envelope, plain.envelope,
                                                 relayed.envelope}
    # A release before circuit addresses would end the session on ours and Mallory's.
    assert book.outgoing(NOW, everyone, circuits=False) == (plain.envelope,)


def test_peers_behind_a_relay_that_is_back_are_dialled_at_once() -> None:
    relay, other = node_id_of(key("r")), node_id_of(key("o"))
    table = PeerTable(A)
    table.on_exchanged(B, (ADDR, f"/ip4/203.0.113.7/tcp/1/p2p/{relay}/p2p-circuit"), NOW)
    table.on_exchanged(M, (f"/ip4/203.0.113.8/tcp/1/p2p/{other}/p2p-circuit",), NOW)
    for peer in table.due(NOW):
        table.failed(peer, "relay gone", NOW)
        PeerTable.release(peer)
    assert table.due(NOW + 0.1) == []
    assert table.retry_via_relay(relay) == 1
    assert [p.id for p in table.due(NOW + 0.1)] == [B]  # not M: its relay is another
