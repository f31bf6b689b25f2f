"""Messages: round trips, and every msgpack trick a hostile peer can play."""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
import pytest

from peerd.core.reasons import Reason
from peerd.protocol.errors import ProtocolError, UnknownVersionError, VersionTooOldError
from peerd.protocol.identity import node_id_of
from peerd.protocol.limits import MAX_CONTROL_FRAME_LEN, MAX_DIGEST_ITEMS
from peerd.protocol.manifest import Manifest
from peerd.protocol.messages import (
    Digest,
    DigestItem,
    Entry,
    Error,
    Hello,
    ManifestMessage,
    Message,
    Want,
    decode_frame,
)
from tests.protocol.helpers import ADMIN, ALICE, BOB, FLEET, NOW, entry, manifest

A = node_id_of(ALICE)
B = node_id_of(BOB)


def body(obj: Any) -> bytes:
    out = msgpack.packb(obj, use_bin_type=True)
    assert isinstance(out, bytes)
    return out


def hello(**over: Any) -> dict[str, Any]:
    msg = {"type": "hello", "v": 1, "fleet": FLEET, "node": A, "manifest_seq": 3, "caps": []}
    msg.update(over)
    return msg


def reason_of(frame: bytes) -> Reason:
    with pytest.raises(ProtocolError) as exc:
        decode_frame(frame)
    return exc.value.reason


MESSAGES: list[Message] = [
    Hello(FLEET, A, 7, ("zstd", "relay")),
    Digest((DigestItem(A, 3, NOW, b"\x11" * 32), DigestItem(B, 0, 0.0, b"\x22" * 32))),
    Digest(()),
    Want(((A, 3), (B, 9))),
    ManifestMessage(manifest().sign(ADMIN)),
    Error("version_unknown", "upgrade me"),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_control_messages_round_trip(msg: Message) -> None:
    wire = msg.to_wire()
    assert struct.unpack(">I", wire[:4])[0] == len(wire) - 4
    assert decode_frame(wire[4:]) == msg


def test_entry_round_trip_keeps_payload_as_a_view_of_the_frame() -> None:
    msg = entry()
    frame = bytearray(msg.to_wire()[4:])
    decoded = decode_frame(frame)
    assert isinstance(decoded, Entry)
    assert decoded.envelope == msg.envelope
    assert bytes(decoded.payload) == bytes(msg.payload)
    assert isinstance(decoded.payload, memoryview)
    assert decoded.payload.readonly


def test_manifest_message_carries_a_verifiable_manifest() -> None:
    decoded = decode_frame(ManifestMessage(manifest().sign(ADMIN)).to_wire()[4:])
    assert isinstance(decoded, ManifestMessage)
    assert Manifest.from_bytes(decoded.envelope.body) == manifest()


def test_nesting_bomb() -> None:
    deep = b"\x91" * 10_000 + b"\xc0"  # [[[[...nil...]]]] ten thousand deep, 10 kB
    assert reason_of(deep) is Reason.MALFORMED
    assert reason_of(body(hello(caps=[[[[[[[[[["x"]]]]]]]]]]))) is Reason.MALFORMED


def test_array_header_claiming_2_to_the_32_elements() -> None:
    # array32 with 0xffffffff elements: must fail on the header, not try to allocate.
    assert reason_of(b"\xdd\xff\xff\xff\xff") is Reason.MALFORMED
    assert reason_of(b"\xdf\xff\xff\xff\xff") is Reason.MALFORMED  # map32 likewise
    assert reason_of(b"\xc6\xff\xff\xff\xff") is Reason.MALFORMED  # bin32 likewise


def test_integer_map_keys() -> None:
    assert reason_of(b"\x81\x01\x02") is Reason.MALFORMED
    assert reason_of(body({**hello(), 1: 2})) is Reason.MALFORMED


def test_ext_types_and_timestamps() -> None:
    assert reason_of(body(msgpack.ExtType(5, b"abcd"))) is Reason.MALFORMED
    ts = msgpack.packb(msgpack.Timestamp(1, 0))
    assert reason_of(body(hello())[:-1] + b"\x91" + ts) is Reason.MALFORMED


def test_trailing_bytes_after_control_message() -> None:
    assert reason_of(body(hello()) + b"\x00") is Reason.MALFORMED


def test_duplicate_keys() -> None:
    raw = body(hello())
    dup = b"\x87" + raw[1:] + body("node") + body(B)  # 7 pairs, "node" twice
    assert reason_of(dup) is Reason.MALFORMED


def test_unknown_and_missing_fields() -> None:
    assert reason_of(body({**hello(), "extra": 1})) is Reason.MALFORMED
    short = hello()
    del short["caps"]
    assert reason_of(body(short)) is Reason.MALFORMED
    assert reason_of(body(hello(type="gossip"))) is Reason.MALFORMED
    assert reason_of(body([1, 2])) is Reason.MALFORMED


@pytest.mark.parametrize("bad", [True, -1, 2**64 - 1, 1.0, "3", None])
def test_wrong_integer_types(bad: Any) -> None:
    assert reason_of(body(hello(manifest_seq=bad))) is Reason.MALFORMED


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0, 5])
def test_nan_inf_and_negative_timestamps(bad: Any) -> None:
    digest = {"type": "digest", "v": 1, "entries": [[A, 1, bad, b"\x00" * 32]]}
    assert reason_of(body(digest)) is Reason.MALFORMED


@pytest.mark.parametrize("bad", ["", "12D3KooW", "1" + A, A.lower(), "0OIl" * 10, 12])
def test_bad_node_ids(bad: Any) -> None:
    assert reason_of(body(hello(node=bad))) is Reason.MALFORMED


def test_wrong_lengths_for_fixed_size_fields() -> None:
    assert reason_of(body(hello(fleet=FLEET[:-1]))) is Reason.MALFORMED
    assert reason_of(body(hello(fleet=FLEET.hex()))) is Reason.MALFORMED


def test_too_old_and_unknown_versions_are_distinct_errors() -> None:
    with pytest.raises(VersionTooOldError) as old:
        decode_frame(body(hello(v=0)))
    with pytest.raises(UnknownVersionError) as new:
        decode_frame(body(hello(v=2)))
    assert old.value.code == "version_too_old"
    assert new.value.code == "version_unknown"
    assert reason_of(body(hello(v=-1))) is Reason.MALFORMED


def test_oversized_control_frame() -> None:
    big = Error("x", "y" * 1000).to_wire()[4:] + b"\x00" * MAX_CONTROL_FRAME_LEN
    assert reason_of(big) is Reason.TOO_LARGE


def test_too_many_digest_items() -> None:
    items = [[A, i, 1.0, b"\x00" * 32] for i in range(MAX_DIGEST_ITEMS + 1)]
    assert reason_of(body({"type": "digest", "v": 1, "entries": items})) is Reason.TOO_LARGE


def test_error_code_charset() -> None:
    assert reason_of(body({"type": "error", "v": 1, "code": "Bad Code", "text": ""})) is (
        Reason.MALFORMED
    )


def test_invalid_utf8() -> None:
    assert reason_of(body(hello())[:-1] + b"\x91\xa2\xff\xfe") is Reason.MALFORMED


def test_digest_at_the_item_limit_fits_a_control_frame() -> None:
    items = tuple(DigestItem(A, i, NOW, b"\x00" * 32) for i in range(MAX_DIGEST_ITEMS))
    wire = Digest(items).to_wire()
    assert len(wire) - 4 <= MAX_CONTROL_FRAME_LEN
    assert decode_frame(wire[4:]) == Digest(items)
