"""Frame decoder: arbitrary chunking, and length prefixes that lie."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.reasons import Reason
from peerd.protocol.errors import ProtocolError
from peerd.protocol.frames import (
    FrameDecoder,
    FrameTooLargeError,
    encode_frame,
    frame_header,
    parse_frame_header,
)
from peerd.protocol.limits import MAX_CONTROL_FRAME_LEN, MAX_FRAME_LEN_CEILING


def test_frames_split_at_every_byte_boundary() -> None:
    stream = encode_frame(b"hello") + encode_frame(b"") + encode_frame(b"x" * 300)
    dec = FrameDecoder()
    out: list[bytes] = []
    for i in range(len(stream)):
        out += [bytes(f) for f in dec.feed(stream[i : i + 1])]
    assert out == [b"hello", b"", b"x" * 300]
    dec.close()


@settings(max_examples=200, deadline=None)
@given(bodies=st.lists(st.binary(max_size=200), max_size=6), cuts=st.lists(st.integers(0, 2000)))
def test_any_chunking_yields_the_same_frames(bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(b) for b in bodies)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    dec = FrameDecoder()
    out: list[bytes] = []
    for a, b in itertools.pairwise(points):
        out += [bytes(f) for f in dec.feed(stream[a:b])]
    assert out == bodies


def test_length_prefix_overflow_rejected_before_allocation() -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError) as exc:
        dec.feed(b"\xff\xff\xff\xff" + b"a")
    assert exc.value.reason is Reason.TOO_LARGE
    assert dec.buffered == 0  # nothing was buffered for the claimed 4 GiB
    with pytest.raises(ProtocolError):  # a desynchronised stream stays failed
        dec.feed(encode_frame(b"ok"))


def test_control_limit_is_inclusive() -> None:
    dec = FrameDecoder()
    body = b"a" * MAX_CONTROL_FRAME_LEN
    assert [bytes(f) for f in dec.feed(encode_frame(body))] == [body]
    with pytest.raises(ProtocolError) as exc:
        dec.feed(struct.pack(">I", MAX_CONTROL_FRAME_LEN + 1))
    assert exc.value.reason is Reason.TOO_LARGE


def test_slow_sender_claiming_a_large_frame_costs_only_what_it_sent() -> None:
    dec = FrameDecoder(max_frame_len=50_000_000)
    assert dec.feed(struct.pack(">I", 50_000_000) + b"abc") == []
    assert dec.buffered == 3


@pytest.mark.parametrize("stream", [b"\x00", b"\x00\x00\x00\x05abc"])
def test_stream_ending_inside_a_frame_is_malformed(stream: bytes) -> None:
    dec = FrameDecoder()
    assert dec.feed(stream) == []
    with pytest.raises(ProtocolError) as exc:
        dec.close()
    assert exc.value.reason is Reason.MALFORMED


@pytest.mark.parametrize("length", [0, 1, 0xFF, 0x01020304, MAX_FRAME_LEN_CEILING])
def test_header_roundtrip_with_an_inclusive_limit(length: int) -> None:
    header = frame_header(length)
    assert header == struct.pack(">I", length)  # 4 bytes, big-endian, unsigned
    assert parse_frame_header(header, length) == length
    with pytest.raises(FrameTooLargeError) as exc:
        parse_frame_header(struct.pack(">I", length + 1), length)
    assert (exc.value.length, exc.value.max_len) == (length + 1, length)
    assert exc.value.reason is Reason.TOO_LARGE  # a ProtocolError, counted as too_large


def test_header_helpers_refuse_what_the_format_cannot_carry() -> None:
    with pytest.raises(ValueError, match="a frame header is 4 bytes, not 3"):
        parse_frame_header(b"\x00\x00\x01", 10)  # not a whole header
    with pytest.raises(ValueError, match=f"frame length {MAX_FRAME_LEN_CEILING + 1} out of"):
        frame_header(MAX_FRAME_LEN_CEILING + 1)  # no peer would read it
    with pytest.raises(ValueError, match="frame length -1 out of range"):
        frame_header(-1)


def test_decoder_refuses_with_the_shared_header_error() -> None:
    dec = FrameDecoder(max_frame_len=10)
    with pytest.raises(FrameTooLargeError) as exc:
        dec.feed(frame_header(11))
    assert exc.value.length == 11
