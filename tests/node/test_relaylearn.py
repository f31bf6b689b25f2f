"""Relays learned by address exchange (issue 27 item 2): the signed ``relay`` field of an
address record (peerd.protocol.peerrecord), who may be sent it (peerd.node.addrbook), and
the choice of learned relays (peerd.node.relaylearn): bounds, expiry, precedence of the
configured relays, never ourselves."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from peerd.core.reasons import Reason
from peerd.node.addrbook import AddressBook
from peerd.node.relaylearn import MAX_LEARNED_RELAYS, pick_learned, relay_addr
from peerd.protocol.envelope import SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import node_id_of
from peerd.protocol.limits import MAX_RECORD_ADDRS, MAX_RECORD_BODY_LEN, MAX_RECORD_MULTIADDR_LEN
from peerd.protocol.peerrecord import ADDRS_DOMAIN, PeerRecord, sign_record, verify_record
from peerd.protocol.wire import pack, unpack_exact
from tests.protocol.helpers import ALICE, BOB, FLEET, MALLORY, NOW, key

PUBLIC = "/ip4/203.0.113.10/tcp/4011"
SITE = "/ip4/10.1.1.2/tcp/4011"
A, B = node_id_of(ALICE), node_id_of(BOB)
RELAYS = [key(f"relay{i}") for i in range(4)]
IDS = [node_id_of(k) for k in RELAYS]


def rec(k=BOB, *, addrs: tuple[str, ...] = (PUBLIC,), ttl: float = 3600,  # type: ignore[no-untyped-def]
        relay: bool = True, seq: int = 1) -> PeerRecord:
    return sign_record(k, FLEET, seq=seq, addrs=addrs, expires=NOW + ttl, relay=relay)


def everyone(_: str) -> bool:
    return True


def roundtrip(r: PeerRecord) -> PeerRecord:
    return verify_record(SignedEnvelope.from_wire(r.envelope.to_wire()), FLEET, NOW)


# ---------------------------------------------------------------------- the record field
def test_the_relay_field_is_signed_and_decoded_and_absent_unless_claimed() -> None:
    assert roundtrip(rec(relay=True)).relay is True
    plain = rec(relay=False)
    assert roundtrip(plain).relay is False
    # Without the claim, the body is what a release before the field signs: old peers
    # verify it (exactly the six keys they know).
    assert set(unpack_exact(plain.envelope.body, 10_000)) == {
        "type", "fleet", "node", "seq", "addrs", "expires"}


def test_an_old_record_without_the_field_still_verifies() -> None:
    body = {"type": "addrs", "fleet": FLEET, "node": B, "seq": 3, "addrs": [PUBLIC],
            "expires": NOW + 60}
    got = verify_record(SignedEnvelope.sign(BOB, ADDRS_DOMAIN, FLEET, pack(body)), FLEET, NOW)
    assert (got.node_id, got.seq, got.relay) == (B, 3, False)


def test_nobody_can_claim_the_relay_field_for_another_member() -> None:
    # Mallory signs a record naming Bob as a relay: the id is the key, it cannot verify.
    body = {"type": "addrs", "fleet": FLEET, "node": B, "seq": 9, "addrs": [PUBLIC],
            "expires": NOW + 60, "relay": True}
    with pytest.raises(ProtocolError) as err:
        verify_record(SignedEnvelope.sign(MALLORY, ADDRS_DOMAIN, FLEET, pack(body)), FLEET, NOW)
    assert err.value.reason == Reason.BAD_SIGNATURE
    # Nor add it to Bob's record: the signature covers the body.
    env = rec(relay=False).envelope
    raw = unpack_exact(env.body, 10_000)
    forged = dataclasses.replace(env, body=pack({**raw, "relay": True}))
    with pytest.raises(ProtocolError) as err:
        verify_record(forged, FLEET, NOW)
    assert err.value.reason == Reason.BAD_SIGNATURE


@pytest.mark.parametrize("value", [False, 1, "yes", None])
def test_a_relay_field_other_than_true_is_malformed(value: object) -> None:
    body = {"type": "addrs", "fleet": FLEET, "node": B, "seq": 1, "addrs": [PUBLIC],
            "expires": NOW + 60, "relay": value}
    with pytest.raises(ProtocolError) as err:
        verify_record(SignedEnvelope.sign(BOB, ADDRS_DOMAIN, FLEET, pack(body)), FLEET, NOW)
    assert err.value.reason == Reason.MALFORMED


def test_the_largest_record_with_the_claim_fits_the_body_bound() -> None:
    addrs = tuple(f"/dns4/{str(i) * 113}/tcp/4011" for i in range(MAX_RECORD_ADDRS))
    assert {len(a) for a in addrs} == {MAX_RECORD_MULTIADDR_LEN}
    r = sign_record(BOB, FLEET, seq=2**62, addrs=addrs, expires=NOW + 60, relay=True)
    assert roundtrip(r).relay
    assert len(r.envelope.body) <= MAX_RECORD_BODY_LEN


def test_the_claim_expires_with_its_record() -> None:
    r = rec(ttl=60)
    with pytest.raises(ProtocolError) as err:
        verify_record(r.envelope, FLEET, NOW + 61)
    assert err.value.reason == Reason.EXPIRED


def test_records_claiming_a_relay_go_only_to_peers_that_take_them() -> None:
    book = AddressBook(ALICE, FLEET)
    book.sign_own((PUBLIC,), NOW, relay=True)
    plain = rec(MALLORY, relay=False)
    assert book.offer(rec()) is not None
    assert book.offer(plain) is not None
    assert book.own is not None
    assert book.own.relay
    assert len(book.outgoing(NOW, everyone)) == 3
    assert book.outgoing(NOW, everyone, relays=False) == (plain.envelope,)


def test_our_record_is_signed_again_when_the_relay_service_is_turned_on() -> None:
    book = AddressBook(ALICE, FLEET)
    first = book.sign_own((PUBLIC,), NOW)
    again = book.sign_own((PUBLIC,), NOW + 1, relay=True)
    assert first is not None
    assert again is not None
    assert (first.relay, again.relay) == (False, True)
    assert again.seq > first.seq
    assert book.sign_own((PUBLIC,), NOW + 2, relay=True) is again


# ---------------------------------------------------------------------- the choice
def pick(records: list[PeerRecord], *, now: float = NOW, configured: tuple[str, ...] = (),
         current: tuple[str, ...] = (),
         member: Callable[[str], bool] = everyone) -> tuple[str, ...]:
    return pick_learned(records, self_id=A, now=now, is_member=member,
                        configured=configured, current=current)


def test_a_relay_needs_a_direct_address_another_site_can_dial() -> None:
    relay_id = IDS[0]
    circuit = f"{PUBLIC}/p2p/{IDS[1]}/p2p-circuit"
    assert relay_addr(rec(RELAYS[0], addrs=(SITE, PUBLIC))) == f"{PUBLIC}/p2p/{relay_id}"
    assert relay_addr(rec(RELAYS[0], addrs=(SITE, circuit))) is None
    assert relay_addr(rec(RELAYS[0], addrs=("/ip4/192.168.1.4/tcp/1",
                                            "/ip6/fd00::1/tcp/1"))) is None
    assert relay_addr(rec(RELAYS[0], addrs=("/dns4/relay.example/tcp/4011",))) == \
        f"/dns4/relay.example/tcp/4011/p2p/{relay_id}"
    assert relay_addr(rec(RELAYS[0], relay=False)) is None


def test_at_most_the_bound_freshest_first_ties_by_id() -> None:
    records = [rec(k, ttl=1000 + 100 * i) for i, k in enumerate(RELAYS)]
    got = pick(records)
    assert len(got) == MAX_LEARNED_RELAYS == 2
    assert got == (f"{PUBLIC}/p2p/{IDS[3]}", f"{PUBLIC}/p2p/{IDS[2]}")
    assert pick(list(reversed(records))) == got  # the book's order does not matter
    same = [rec(k, ttl=500) for k in RELAYS]
    assert pick(same) == tuple(f"{PUBLIC}/p2p/{i}" for i in sorted(IDS)[:2])


def test_learned_relays_stay_while_they_qualify_and_go_when_their_record_expires() -> None:
    old = [rec(RELAYS[0], ttl=100), rec(RELAYS[1], ttl=200)]
    first = pick(old)
    # A fresher relay record arrives: the held ones stay (no reservation churn).
    fresher = [*old, rec(RELAYS[2], ttl=3000)]
    assert pick(fresher, current=first) == first
    # The first one's record expires: the fresher one fills its place.
    assert pick(fresher, now=NOW + 150, current=first) == (
        f"{PUBLIC}/p2p/{IDS[1]}", f"{PUBLIC}/p2p/{IDS[2]}")
    assert pick(fresher, now=NOW + 5000, current=first) == ()


def test_non_members_ourselves_and_configured_relays_are_never_learned() -> None:
    own = rec(ALICE)  # a book never holds ours; a list handed in still must not yield it
    configured = f"/ip4/198.51.100.1/tcp/4011/p2p/{IDS[0]}"
    records = [own, rec(RELAYS[0]), rec(RELAYS[1]), rec(RELAYS[2])]
    got = pick(records, configured=(configured,), member=lambda n: n != IDS[2])
    assert got == (f"{PUBLIC}/p2p/{IDS[1]}",)
    # A member revoked by the manifest (pruned) loses its place at once.
    assert pick(records, current=got, member=lambda n: n not in (IDS[1], IDS[2])) == \
        (f"{PUBLIC}/p2p/{IDS[0]}",)
