"""Signed address records (peerd.protocol.peerrecord), the Addrs message and the session's
Addrs turn: what verifies, what is refused and why, hostile input included."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.reasons import Reason
from peerd.protocol import messages as msg
from peerd.protocol.envelope import ENTRY_DOMAIN, SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.frames import encode_frame
from peerd.protocol.identity import node_id_of
from peerd.protocol.limits import (
    MAX_ADDR_RECORDS,
    MAX_CONTROL_FRAME_LEN,
    MAX_RECORD_ADDRS,
    MAX_RECORD_BODY_LEN,
    MAX_RECORD_MULTIADDR_LEN,
    MAX_RECORD_TTL_S,
)
from peerd.protocol.peerrecord import (
    ADDRS_DOMAIN,
    check_circuit,
    check_multiaddr,
    check_record_addr,
    sign_record,
    verify_record,
)
from peerd.protocol.session import Phase, Session
from peerd.protocol.wire import pack
from tests.protocol.helpers import ALICE, BOB, FLEET, MALLORY, NOW, OTHER_FLEET
from tests.protocol.test_session import SIGNED, Peer, run

ADDR = "/ip4/10.0.0.2/tcp/4011"


def record(key=ALICE, *, seq: int = 1, addrs: tuple[str, ...] = (ADDR,),  # type: ignore[no-untyped-def]
           expires: float = NOW + 3600, fleet: bytes = FLEET):
    return sign_record(key, fleet, seq=seq, addrs=addrs, expires=expires)


def test_a_record_verifies_and_decodes_to_what_was_signed() -> None:
    r = record(seq=7, addrs=(ADDR, "/dns4/a.example/tcp/4011"))
    got = verify_record(SignedEnvelope.from_wire(r.envelope.to_wire()), FLEET, NOW)
    assert (got.node_id, got.seq, got.addrs, got.expires) == (
        node_id_of(ALICE), 7, (ADDR, "/dns4/a.example/tcp/4011"), NOW + 3600)


def _forged(body: dict[str, object], key=MALLORY) -> SignedEnvelope:  # type: ignore[no-untyped-def]
    return SignedEnvelope.sign(key, ADDRS_DOMAIN, FLEET, pack(body))


def _body(**over: object) -> dict[str, object]:
    body: dict[str, object] = {"type": "addrs", "fleet": FLEET, "node": node_id_of(ALICE),
                               "seq": 1, "addrs": [ADDR], "expires": NOW + 60}
    return {**body, **over}


def test_a_record_naming_another_node_than_its_signer_is_refused() -> None:
    # Mallory signs a record claiming to be Alice: the id is the key, so it cannot verify.
    with pytest.raises(ProtocolError) as err:
        verify_record(_forged(_body()), FLEET, NOW)
    assert err.value.reason == Reason.BAD_SIGNATURE


def test_a_tampered_record_or_one_with_its_key_swapped_is_refused() -> None:
    env = record().envelope
    tampered = dataclasses.replace(env, body=env.body.replace(b"10.0.0.2", b"10.6.6.6"))
    swapped = dataclasses.replace(env, key=record(MALLORY).envelope.key)
    for bad in (tampered, swapped):
        with pytest.raises(ProtocolError) as err:
            verify_record(bad, FLEET, NOW)
        assert err.value.reason == Reason.BAD_SIGNATURE


def test_domain_and_fleet_separate_records_from_other_signatures() -> None:
    body = record().envelope.body
    as_entry = SignedEnvelope.sign(ALICE, ENTRY_DOMAIN, FLEET, body)
    with pytest.raises(ProtocolError) as err:
        verify_record(as_entry, FLEET, NOW)
    assert err.value.reason == Reason.BAD_SIGNATURE
    with pytest.raises(ProtocolError) as err:
        verify_record(record(fleet=OTHER_FLEET).envelope, FLEET, NOW)
    assert err.value.reason == Reason.WRONG_FLEET


def test_expiry_is_bounded_both_ways() -> None:
    with pytest.raises(ProtocolError) as err:
        verify_record(record(expires=NOW).envelope, FLEET, NOW)
    assert err.value.reason == Reason.EXPIRED
    far = record(expires=NOW + MAX_RECORD_TTL_S + 1).envelope
    with pytest.raises(ProtocolError) as err:
        verify_record(far, FLEET, NOW)
    assert err.value.reason == Reason.MALFORMED
    verify_record(record(expires=NOW + MAX_RECORD_TTL_S).envelope, FLEET, NOW)


@pytest.mark.parametrize("addrs", [
    [], ["/ip4/0.0.0.0/tcp/4011"], ["/ip6/::/tcp/4011"], ["/ip4/224.0.0.251/tcp/4011"],
    [ADDR + "/p2p/" + node_id_of(ALICE)], ["/ip4/10.0.0.2/udp/4011"], ["/ip4/10.0.0.2/tcp/0"],
    ["/ip4/10.0.0.2/tcp/04011"], ["/ip4/::1/tcp/1"], ["/dns4/a b/tcp/1"], [ADDR, ADDR],
    ["/dns4/" + "a" * MAX_RECORD_MULTIADDR_LEN + "/tcp/1"], [1], [ADDR] * (MAX_RECORD_ADDRS + 1),
])
def test_bad_addresses_are_refused_by_the_receiver_and_never_signed(addrs: list[object]) -> None:
    with pytest.raises(ProtocolError) as err:
        verify_record(_forged(_body(addrs=addrs), key=ALICE), FLEET, NOW)
    assert err.value.reason in (Reason.MALFORMED, Reason.TOO_LARGE)
    if all(isinstance(a, str) for a in addrs):
        with pytest.raises(ValueError, match=r"record|multiaddr"):
            record(addrs=tuple(addrs))  # type: ignore[arg-type]


@pytest.mark.parametrize("over", [{"seq": -1}, {"seq": True}, {"expires": 5}, {"type": "x"},
                                  {"node": "12D3KooWnope"}, {"extra": 1}])
def test_malformed_bodies_are_refused(over: dict[str, object]) -> None:
    with pytest.raises(ProtocolError) as err:
        verify_record(_forged(_body(**over), key=ALICE), FLEET, NOW)
    assert err.value.reason == Reason.MALFORMED


def test_an_oversized_body_is_refused_before_its_signature_is_checked() -> None:
    env = dataclasses.replace(record().envelope, body=b"\0" * (MAX_RECORD_BODY_LEN + 1))
    with pytest.raises(ProtocolError) as err:
        verify_record(env, FLEET, NOW)
    assert err.value.reason == Reason.TOO_LARGE


def _largest_record(i: int) -> SignedEnvelope:
    longest = [f"/dns4/{chr(97 + j) * (MAX_RECORD_MULTIADDR_LEN - 16)}/tcp/65535"
               for j in range(MAX_RECORD_ADDRS)]
    from tests.protocol.helpers import key
    return sign_record(key(f"n{i}"), FLEET, seq=2**63 - 1, addrs=longest,
                       expires=NOW + MAX_RECORD_TTL_S).envelope


def test_the_largest_addrs_message_fits_a_control_frame() -> None:
    records = tuple(_largest_record(i) for i in range(MAX_ADDR_RECORDS))
    assert all(len(r.body) <= MAX_RECORD_BODY_LEN for r in records)
    frame = msg.Addrs(records).head()
    assert len(frame) <= MAX_CONTROL_FRAME_LEN
    assert msg.decode_frame(frame) == msg.Addrs(records)


def test_more_records_than_the_limit_are_refused_as_too_large() -> None:
    one = record().envelope
    head = pack({"type": "addrs", "v": 1, "records": [one.to_wire()] * (MAX_ADDR_RECORDS + 1)})
    with pytest.raises(ProtocolError) as err:
        msg.decode_frame(head)
    assert err.value.reason == Reason.TOO_LARGE


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=MAX_RECORD_BODY_LEN))
def test_any_body_either_verifies_or_raises_protocol_error(body: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        verify_record(SignedEnvelope.sign(ALICE, ADDRS_DOMAIN, FLEET, body), FLEET, NOW)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_either_is_a_dialable_multiaddr_or_is_refused(text: str) -> None:
    with contextlib.suppress(ProtocolError):
        assert check_multiaddr(text) == text


RELAY = node_id_of(BOB)
CIRCUIT = f"/ip4/203.0.113.7/tcp/4011/p2p/{RELAY}/p2p-circuit"


def test_a_record_may_name_a_circuit_address_at_a_relay() -> None:
    r = record(addrs=(ADDR, CIRCUIT))
    got = verify_record(SignedEnvelope.from_wire(r.envelope.to_wire()), FLEET, NOW)
    assert got.addrs == (ADDR, CIRCUIT)


@pytest.mark.parametrize("bad", [
    "/ip4/203.0.113.7/tcp/4011/p2p-circuit",  # no relay id
    "/ip4/203.0.113.7/tcp/4011/p2p/12D3KooWabc/p2p-circuit",  # not a peer id
    f"/ip4/0.0.0.0/tcp/4011/p2p/{RELAY}/p2p-circuit",  # no destination
    f"/ip4/203.0.113.7/udp/4011/p2p/{RELAY}/p2p-circuit",  # not TCP
    f"/ip4/203.0.113.7/tcp/4011/p2p/{RELAY}/p2p-circuit/p2p/{RELAY}",  # the member's own id
    f"/dns4/{'a' * 80}.example/tcp/4011/p2p/{RELAY}/p2p-circuit",  # too long
])
def test_a_malformed_circuit_address_is_refused_in_a_record(bad: str) -> None:
    with pytest.raises(ProtocolError):
        check_record_addr(bad)
    body = _body(addrs=[bad])
    with pytest.raises(ProtocolError) as err:
        verify_record(SignedEnvelope.sign(ALICE, ADDRS_DOMAIN, FLEET, pack(body)), FLEET, NOW)
    assert err.value.reason == Reason.MALFORMED


def test_a_circuit_is_no_direct_address() -> None:
    assert check_circuit(CIRCUIT) == CIRCUIT
    with pytest.raises(ProtocolError):
        check_multiaddr(CIRCUIT)  # what bootstrap and the TCP dial take stays direct only


# ---------------------------------------------------------------- the session's Addrs turn
def addr_session(initiator: bool, me: str, peer: str, caps: tuple[str, ...]) -> Session:
    return Session(initiator=initiator, hello=msg.Hello(FLEET, me, 1, caps), peer_id=peer,
                   manifest=SIGNED[1], entry_frame_limit=1 << 20)


class AddrPeer(Peer):
    def build(self, phase: Phase) -> msg.Message:
        if phase is Phase.ADDRS:
            return msg.Addrs((record(ALICE if self.session.initiator else BOB).envelope,))
        return super().build(phase)


A, B = node_id_of(ALICE), node_id_of(BOB)
BOTH = ("entries/v1", msg.ADDRS_CAPABILITY)


def test_both_sides_announcing_it_exchange_addrs_after_admission_before_the_digests() -> None:
    a, b = AddrPeer(addr_session(True, A, B, BOTH)), AddrPeer(addr_session(False, B, A, BOTH))
    transcript = run(a, b)
    assert transcript[:8] == [("a", "hello"), ("b", "hello"), ("b", "check"), ("a", "check"),
                              ("a", "addrs"), ("b", "addrs"), ("a", "digest"), ("b", "digest")]


@pytest.mark.parametrize("caps", [(("entries/v1",), BOTH), (BOTH, ("entries/v1",))])
def test_a_peer_without_the_capability_gets_the_v1_session(
        caps: tuple[tuple[str, ...], tuple[str, ...]]) -> None:
    a = AddrPeer(addr_session(True, A, B, caps[0]))
    b = AddrPeer(addr_session(False, B, A, caps[1]))
    assert all(what != "addrs" for _, what in run(a, b))


def test_an_addrs_frame_out_of_its_turn_is_refused() -> None:
    a = addr_session(False, A, B, ("entries/v1",))  # no exchange: addrs never expected
    a.receive(msg.Hello(FLEET, B, 1, BOTH).head())
    a.send(a.next_step().message)  # type: ignore[union-attr, arg-type]
    a.next_step()
    a.peer_admitted()
    stray = msg.Addrs((record().envelope,)).head()
    with pytest.raises(ProtocolError) as err:
        a.receive(stray)
    assert err.value.reason == Reason.MALFORMED
    assert encode_frame(stray)  # the frame itself is well-formed: refused for its turn
