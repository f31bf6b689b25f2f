"""What a rendezvous point tells the daemon (peerd.daemon.addresses.Addresses.found): a member's
circuits become dialable hints; with its signed record in the book the two are merged, so
the peer's addresses do not flip between the sources (each flip would redial it)."""

from __future__ import annotations

from pathlib import Path

from peerd.daemon.addresses import Addresses
from peerd.node.addrbook import AddressBook
from peerd.node.peers import PeerTable
from peerd.protocol.identity import node_id_of
from peerd.protocol.peerrecord import sign_record
from peerd.store.statedir import StateDir
from tests.protocol.helpers import ALICE, BOB, FLEET, NOW, key

A, B = node_id_of(ALICE), node_id_of(BOB)
CIRCUIT = f"/ip4/203.0.113.7/tcp/4011/p2p/{node_id_of(key('r'))}/p2p-circuit"


def addresses(tmp_path: Path) -> tuple[Addresses, PeerTable, list[int]]:
    peers, woken = PeerTable(A), [0]

    def wake() -> None:
        woken[0] += 1

    book = AddressBook(ALICE, FLEET)
    return Addresses(book, peers, StateDir(tmp_path), lambda: NOW, lambda _: True,
                     wake), peers, woken


def test_a_member_found_at_a_relay_is_entered_with_its_circuit_and_dialled(
        tmp_path: Path) -> None:
    addrs, peers, woken = addresses(tmp_path)
    addrs.found(B, (CIRCUIT,))
    peer = peers.get(B)
    assert peer is not None
    assert peer.addrs == (CIRCUIT,)
    assert woken == [1]
    addrs.found(B, (CIRCUIT,))  # the next DISCOVER says the same: nothing to do
    assert woken == [1]


def test_a_found_circuit_joins_the_members_record_and_stays_put(tmp_path: Path) -> None:
    addrs, peers, woken = addresses(tmp_path)
    record = sign_record(BOB, FLEET, seq=1, addrs=("/ip4/10.1.0.2/tcp/4011",),
                         expires=NOW + 3600)
    learned = addrs.book.offer(record)
    assert learned is not None
    addrs.learned([learned])
    addrs.found(B, (CIRCUIT,))
    peer = peers.get(B)
    assert peer is not None
    assert peer.addrs == ("/ip4/10.1.0.2/tcp/4011", CIRCUIT)  # the record's first
    before = woken[0]
    addrs.found(B, (CIRCUIT,))
    assert peer.addrs == ("/ip4/10.1.0.2/tcp/4011", CIRCUIT)
    assert woken[0] == before
