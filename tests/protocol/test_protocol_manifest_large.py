"""Manifests of fleets of 1,000 nodes: they fit their frame, verify and answer lookups; one
member or revoked id over the limit, or a frame over the manifest's limit, is refused before
anything is built for it."""

from __future__ import annotations

import hashlib
import struct

import pytest

from peerd.core.reasons import Reason
from peerd.protocol import manifest as manifest_module
from peerd.protocol.errors import ProtocolError
from peerd.protocol.frames import FrameDecoder
from peerd.protocol.identity import (
    node_id_from_public_key,
    node_id_of,
    private_key_from_seed,
    public_key_bytes,
)
from peerd.protocol.limits import (
    FRAME_HEADER_LEN,
    MAX_CONTROL_FRAME_LEN,
    MAX_MANIFEST_FRAME_LEN,
    MAX_MEMBERS,
    MAX_REVOKED,
)
from peerd.protocol.manifest import (
    Manifest,
    Member,
    accept_manifest,
    decode_manifest_file,
    encode_manifest_file,
)
from peerd.protocol.messages import ManifestMessage, decode_frame
from tests.protocol.helpers import ADMIN, FLEET, NOW

ADMIN_PUB = public_key_bytes(ADMIN)


def members(n: int, label: str = "member", not_after: float | None = None) -> tuple[Member, ...]:
    keys = (private_key_from_seed(hashlib.sha256(b"%s %d" % (label.encode(), i)).digest())
            for i in range(n))
    return tuple(sorted((Member(node_id_of(k), public_key_bytes(k), not_after) for k in keys),
                        key=lambda m: m.node_id))


def frame_of(m: Manifest) -> bytes:
    """The Manifest frame's body (what the session's limit applies to)."""
    return ManifestMessage(m.sign(ADMIN)).to_wire()[FRAME_HEADER_LEN:]


def test_a_1000_member_manifest_crosses_the_wire_verifies_and_answers_lookups() -> None:
    fleet = members(1000, not_after=NOW + 3600)
    m = Manifest(FLEET, 7, fleet, frozenset(x.node_id for x in members(24, "gone")))
    body = frame_of(m)
    assert MAX_CONTROL_FRAME_LEN < len(body) <= MAX_MANIFEST_FRAME_LEN  # why it has a limit
    received = decode_frame(body)
    assert isinstance(received, ManifestMessage)
    got = accept_manifest(None, received.envelope, ADMIN_PUB, FLEET)
    assert got == m
    assert len(got.members) == 1000
    for x in fleet:
        assert got.check_member(x.node_id, NOW) == x
    with pytest.raises(ProtocolError) as exc:
        got.check_member(node_id_of(ADMIN), NOW)
    assert exc.value.reason is Reason.NOT_MEMBER
    # The file a node keeps is read back under the same limit.
    file = encode_manifest_file(m.sign(ADMIN))
    assert decode_manifest_file(file) == m.sign(ADMIN)


def test_the_largest_manifest_the_format_allows_fits_its_frame_limit() -> None:
    most = Manifest(FLEET, 2**40, members(MAX_MEMBERS, not_after=NOW + 3600.5),
                    frozenset(x.node_id for x in members(MAX_REVOKED, "revoked")))
    body = frame_of(most)
    assert len(body) <= MAX_MANIFEST_FRAME_LEN
    # The limit follows the format's maximum, not a round number far above it.
    assert 2 * len(body) > MAX_MANIFEST_FRAME_LEN
    assert accept_manifest(None, most.sign(ADMIN), ADMIN_PUB, FLEET) == most


def test_one_member_over_the_limit_is_refused_before_any_member_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    over = Manifest(FLEET, 3, members(MAX_MEMBERS + 1))  # no admin would sign it: admit refuses
    body = over.to_bytes()
    derived = 0
    real = node_id_from_public_key  # what peerd.protocol.manifest calls

    def counting(pub: bytes) -> str:
        nonlocal derived
        derived += 1
        return real(pub)

    monkeypatch.setattr(manifest_module, "node_id_from_public_key", counting)
    with pytest.raises(ProtocolError) as exc:
        Manifest.from_bytes(body)
    assert exc.value.reason is Reason.TOO_LARGE
    assert derived == 0  # refused on the array's length, before a single member was read


def test_one_revoked_id_over_the_limit_is_refused() -> None:
    over = Manifest(FLEET, 3, (), frozenset(x.node_id for x in members(MAX_REVOKED + 1)))
    with pytest.raises(ProtocolError) as exc:
        Manifest.from_bytes(over.to_bytes())
    assert exc.value.reason is Reason.TOO_LARGE


def test_the_admin_cannot_admit_past_the_limit() -> None:
    full = Manifest(FLEET, 1, members(MAX_MEMBERS))
    extra = private_key_from_seed(hashlib.sha256(b"one too many").digest())
    with pytest.raises(ValueError, match=f"at most {MAX_MEMBERS} members"):
        full.admit(public_key_bytes(extra), None)
    # Re-admitting a member (a new expiry) is not growth.
    again = full.admit(full.members[0].public_key, NOW)
    assert len(again.members) == MAX_MEMBERS


def test_a_manifest_frame_over_its_limit_is_refused_from_its_length_prefix() -> None:
    dec = FrameDecoder(MAX_MANIFEST_FRAME_LEN)  # what the session's manifest turn reads with
    with pytest.raises(ProtocolError) as exc:
        dec.feed(struct.pack(">I", MAX_MANIFEST_FRAME_LEN + 1) + b"\x80")
    assert exc.value.reason is Reason.TOO_LARGE
    assert dec.buffered == 0  # nothing buffered for the claimed frame


def test_other_control_messages_keep_the_control_frame_limit() -> None:
    # Only a Manifest may be longer: a Digest-typed frame of a manifest's size is refused.
    big = frame_of(Manifest(FLEET, 1, members(1000)))
    assert len(big) > MAX_CONTROL_FRAME_LEN
    assert isinstance(decode_frame(big), ManifestMessage)
    digest_typed = big.replace(b"\xa8manifest", b"\xa6digest", 1)
    with pytest.raises(ProtocolError) as exc:
        decode_frame(digest_typed)
    assert exc.value.reason is Reason.TOO_LARGE


def test_member_lookup_is_an_index_that_follows_every_edit() -> None:
    m = Manifest(FLEET, 1, members(50))
    gone = m.members[10].node_id
    revoked = m.revoke(gone)
    assert revoked.member(gone) is None
    assert m.member(gone) is not None  # the original is untouched (frozen)
    newcomer = private_key_from_seed(hashlib.sha256(b"newcomer").digest())
    admitted = revoked.admit(public_key_bytes(newcomer), None)
    assert admitted.member(node_id_of(newcomer)) is not None
    assert all(admitted.member(x.node_id) == x for x in admitted.members)
    assert Manifest.from_bytes(admitted.to_bytes()) == admitted
    assert hash(admitted) == hash(Manifest.from_bytes(admitted.to_bytes()))
