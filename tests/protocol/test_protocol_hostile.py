"""Whole-pipeline properties: single-bit flips, and the decoder invariant for any bytes.

The pipeline is what a daemon runs on a connection: FrameDecoder -> decode_frame ->
admit_entry. A bit flipped anywhere in a signed entry frame (length prefix, msgpack
structure, envelope, body, signature or payload) must be refused with ProtocolError; and
no byte string whatever may make it raise anything else.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from peerd.core.reasons import Reason
from peerd.protocol.admission import admit_entry, entry_frame_limit
from peerd.protocol.errors import ProtocolError
from peerd.protocol.frames import FrameDecoder, encode_frame
from peerd.protocol.ledger import OriginLedger
from peerd.protocol.messages import Entry, Message, decode_frame
from tests.protocol.helpers import SCHEMA, admit_kwargs, entry

FRAME = entry().to_wire()
FRAME_LIMIT = entry_frame_limit(SCHEMA)
MANIFEST_KW = admit_kwargs()


def run_pipeline(stream: bytes, *, chunk: int | None = None) -> list[Message]:
    """Frames -> messages -> admitted entries; raises ProtocolError on any refusal."""
    dec = FrameDecoder(FRAME_LIMIT)
    frames = []
    step = chunk or max(len(stream), 1)
    for i in range(0, len(stream), step):
        frames += dec.feed(stream[i : i + step])
    dec.close()
    out: list[Message] = []
    for frame in frames:
        msg = decode_frame(frame)
        if isinstance(msg, Entry):
            admit_entry(msg, **{**MANIFEST_KW, "ledger": OriginLedger()})
        out.append(msg)
    return out


def flip(bit: int) -> bytes:
    data = bytearray(FRAME)
    data[bit // 8] ^= 1 << (bit % 8)
    return bytes(data)


def test_unflipped_frame_is_admitted() -> None:
    assert len(run_pipeline(FRAME)) == 1


def test_every_single_bit_flip_of_a_signed_entry_frame_is_rejected() -> None:
    # Exhaustive: all len(FRAME) * 8 positions (~4,600), not a sample.
    survivors = []
    for bit in range(len(FRAME) * 8):
        try:
            run_pipeline(flip(bit))
        except ProtocolError:
            continue
        survivors.append(bit)
    assert survivors == []


def check_flips_rejected(bits: list[int]) -> None:
    data = bytearray(FRAME)
    for bit in bits:
        data[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(ProtocolError):
        run_pipeline(bytes(data))


BIT_LISTS = st.lists(st.integers(0, len(FRAME) * 8 - 1), min_size=1, max_size=3, unique=True)


@pytest.mark.slow  # ~25 s on the shared 2-core CI box (hypothesis costs ~2 ms an example)
@settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bits=BIT_LISTS)
def test_10k_random_bit_flips_of_a_signed_entry_frame_are_rejected(bits: list[int]) -> None:
    check_flips_rejected(bits)


@settings(max_examples=500, deadline=None)
@given(bits=BIT_LISTS)
def test_random_bit_flips_of_a_signed_entry_frame_are_rejected(bits: list[int]) -> None:
    check_flips_rejected(bits)


def outcome(stream: bytes, chunk: int | None) -> object:
    try:
        return run_pipeline(stream, chunk=chunk)
    except ProtocolError as exc:
        return exc.reason


@settings(max_examples=1500, deadline=None)
@given(data=st.binary(max_size=300))
def test_decoder_invariant_for_arbitrary_bytes(data: bytes) -> None:
    # Whole or one byte at a time: a message list or ProtocolError, never anything else,
    # and the same answer either way.
    assert outcome(data, None) == outcome(data, 1)
    assert outcome(encode_frame(data), None) == outcome(encode_frame(data), 1)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(
            st.text(max_size=8) | st.sampled_from(["type", "v", "envelope"]), inner, max_size=5
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    value=msgpack_values,
    msg_type=st.sampled_from(["hello", "digest", "want", "entry", "manifest", "error", "bogus"]),
    v=st.integers(-1, 3),
)
def test_decoder_invariant_for_structured_msgpack(value: object, msg_type: str, v: int) -> None:
    # Valid msgpack shaped like our messages reaches the field checks, not just the parser.
    head = {"type": msg_type, "v": v, "x": value}
    if isinstance(value, dict):
        head = {"type": msg_type, "v": v, **value}
    try:
        packed = msgpack.packb(head, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        return
    frame = encode_frame(packed)
    assert outcome(frame, None) == outcome(frame, 1)


@settings(max_examples=300, deadline=None)
@given(cut=st.integers(1, len(FRAME) - 1), junk=st.binary(min_size=1, max_size=20))
def test_truncated_or_spliced_entry_frames(cut: int, junk: bytes) -> None:
    with pytest.raises(ProtocolError):
        run_pipeline(FRAME[:cut])
    # A truncated frame followed by junk: still refused, whichever way it is chunked.
    spliced = FRAME[:cut] + junk
    assume(not FRAME.startswith(spliced[: len(FRAME)]))  # junk that re-creates the frame
    refusal = outcome(spliced, None)
    assert isinstance(refusal, Reason)
    assert outcome(spliced, 1) == refusal
