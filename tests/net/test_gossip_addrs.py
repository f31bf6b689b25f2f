"""The address exchange in real gossip sessions (peerd.net.gossip over an in-memory stream):
members' records travel from book to book, non-members' never, a forged one ends the
session, and a peer without an address book still gets its entries."""

from __future__ import annotations

import dataclasses

from peerd.net.gossip import SessionContext
from peerd.node.addrbook import AddressBook, Learned
from peerd.protocol.identity import node_id_of
from peerd.protocol.peerrecord import sign_record
from tests.net.test_gossip import CTX, publish, session, signed_node
from tests.node.fleet import FLEET, NOW, key

A, B, C, OUT = key(1), key(2), key(3), key(9)


def ctx(book: AddressBook, learned: list[Learned] | None = None) -> SessionContext:
    sink = learned if learned is not None else []
    return dataclasses.replace(CTX, address_book=book, on_addrs=sink.extend)


def book(k: object, port: int) -> AddressBook:
    b = AddressBook(k, FLEET)  # type: ignore[arg-type]
    b.sign_own((f"/ip4/10.0.0.{port}/tcp/4011",), NOW)
    return b


def test_a_members_record_travels_on_and_lets_a_node_learn_a_member_it_never_met() -> None:
    a, b, c = (signed_node(k, 1, A, B, C) for k in (A, B, C))
    book_a, book_b, book_c = book(A, 1), book(B, 2), book(C, 3)
    learned_c: list[Learned] = []
    session(a, b, a_ctx=ctx(book_a), b_ctx=ctx(book_b))
    assert book_b.get(a.id) == book_a.own
    session(c, b, a_ctx=ctx(book_c, learned_c), b_ctx=ctx(book_b))
    # c met only b, and now holds a's record exactly as a signed it.
    assert book_c.get(a.id) == book_a.own
    assert {item.record.node_id for item in learned_c} == {a.id, b.id}
    assert book_b.get(c.id) == book_c.own


def test_records_of_non_members_are_neither_taken_nor_handed_on() -> None:
    a, b = signed_node(A, 1, A, B), signed_node(B, 1, A, B)
    book_a, book_b = book(A, 1), book(B, 2)
    outsider = sign_record(OUT, FLEET, seq=1, addrs=("/ip4/10.0.0.9/tcp/1",), expires=NOW + 60)
    assert book_a.offer(outsider) is not None  # as if a's manifest had admitted it once
    session(a, b, a_ctx=ctx(book_a), b_ctx=ctx(book_b))
    assert book_b.get(node_id_of(OUT)) is None
    assert book_b.get(a.id) is not None


def test_a_forged_record_ends_the_session_as_bad_signature() -> None:
    a, b = signed_node(A, 1, A, B, C), signed_node(B, 1, A, B, C)
    book_a, book_b = book(A, 1), book(B, 2)
    real = sign_record(C, FLEET, seq=1, addrs=("/ip4/10.0.0.3/tcp/1",), expires=NOW + 60)
    forged_env = dataclasses.replace(real.envelope, body=real.envelope.body.replace(
        b"10.0.0.3", b"10.6.6.6"))
    book_a._records[node_id_of(C)] = dataclasses.replace(real, envelope=forged_env)
    publish(a, 3)
    _, rb = session(a, b, a_ctx=ctx(book_a), b_ctx=ctx(book_b))
    assert rb.refused == {"bad_signature": 1}
    assert book_b.get(node_id_of(C)) is None
    assert not b.cache


def test_a_peer_without_an_address_book_gets_the_v1_session_and_its_entries() -> None:
    a, b = signed_node(A, 1, A, B), signed_node(B, 1, A, B)
    publish(a, 3)
    book_b = book(B, 2)
    ra, rb = session(a, b, a_ctx=CTX, b_ctx=ctx(book_b))
    assert (ra.sent, rb.received, rb.refused) == (1, 1, {})
    assert len(book_b) == 0


def test_a_record_holding_a_circuit_address_travels_between_current_peers() -> None:
    a, b = signed_node(A, 1, A, B), signed_node(B, 1, A, B)
    relay = node_id_of(C)
    book_a, book_b = AddressBook(A, FLEET), book(B, 2)
    book_a.sign_own(("/ip4/10.0.0.1/tcp/4011",
                     f"/ip4/203.0.113.7/tcp/4011/p2p/{relay}/p2p-circuit"), NOW)
    session(a, b, a_ctx=ctx(book_a), b_ctx=ctx(book_b))
    assert book_b.get(a.id) == book_a.own
