"""Fleet manifests: only the admin key, only forward, never two versions of one seq."""

from __future__ import annotations

import pytest

from peerd.core.reasons import Reason
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import node_id_of, public_key_bytes
from peerd.protocol.manifest import (
    Manifest,
    accept_manifest,
    decode_manifest_file,
    encode_manifest_file,
    verify_manifest,
)
from tests.protocol.helpers import ADMIN, ALICE, BOB, FLEET, MALLORY, NOW, OTHER_FLEET, manifest

ADMIN_PUB = public_key_bytes(ADMIN)


def refused(held: Manifest | None, signed: object, fleet: bytes = FLEET) -> Reason:
    with pytest.raises(ProtocolError) as exc:
        accept_manifest(held, signed, ADMIN_PUB, fleet)  # type: ignore[arg-type]
    return exc.value.reason


def test_newer_manifest_accepted() -> None:
    held = manifest()
    newer = held.revoke(node_id_of(BOB))
    got = accept_manifest(held, newer.sign(ADMIN), ADMIN_PUB, FLEET)
    assert got == newer
    assert got.seq == held.seq + 1
    with pytest.raises(ProtocolError) as exc:
        got.check_member(node_id_of(BOB), NOW)
    assert exc.value.reason is Reason.REVOKED


def test_manifest_rollback_to_unrevoke_a_key() -> None:
    older = manifest()
    held = older.revoke(node_id_of(BOB))
    assert refused(held, older.sign(ADMIN)) is Reason.NOT_NEWER
    assert refused(held, held.sign(ADMIN)) is Reason.NOT_NEWER  # replay of the same one


def test_manifest_equivocation_by_admin() -> None:
    held = manifest().revoke(node_id_of(BOB))
    fork = manifest().revoke(node_id_of(ALICE))
    assert fork.seq == held.seq
    assert refused(held, fork.sign(ADMIN)) is Reason.EQUIVOCATION


def test_manifest_signed_by_a_member_not_the_admin() -> None:
    assert refused(None, manifest().admit(public_key_bytes(MALLORY), None).sign(ALICE)) is (
        Reason.BAD_SIGNATURE
    )


def test_manifest_for_another_fleet() -> None:
    theirs = Manifest(fleet_id=OTHER_FLEET, seq=5)
    assert refused(None, theirs.sign(ADMIN)) is Reason.WRONG_FLEET


def test_tampered_manifest_file_every_byte() -> None:
    data = encode_manifest_file(manifest().sign(ADMIN))
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x40
        with pytest.raises(ProtocolError):
            verify_manifest(decode_manifest_file(bytes(bad)), ADMIN_PUB, FLEET)


def test_member_whose_id_does_not_match_its_key() -> None:
    good = manifest()
    body = good.to_bytes().replace(public_key_bytes(ALICE), public_key_bytes(MALLORY))
    with pytest.raises(ProtocolError) as exc:
        Manifest.from_bytes(body)
    assert exc.value.reason is Reason.MALFORMED


def test_revoked_key_cannot_be_readmitted() -> None:
    m = manifest().revoke(node_id_of(ALICE))
    with pytest.raises(ValueError, match="never re-admitted"):
        m.admit(public_key_bytes(ALICE), None)


def test_round_trip_and_membership_queries() -> None:
    m = manifest(**{node_id_of(BOB): NOW + 10})
    assert Manifest.from_bytes(m.to_bytes()) == m
    assert m.check_member(node_id_of(ALICE), NOW).not_after is None
    assert m.member_by_key(public_key_bytes(BOB), NOW + 10).node_id == node_id_of(BOB)
    with pytest.raises(ProtocolError) as exc:
        m.member_by_key(public_key_bytes(BOB), NOW + 10.5)
    assert exc.value.reason is Reason.EXPIRED
    with pytest.raises(ProtocolError) as exc:
        m.check_member(node_id_of(MALLORY), NOW)
    assert exc.value.reason is Reason.NOT_MEMBER
