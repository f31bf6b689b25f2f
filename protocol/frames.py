"""Length-prefixed frames and a sans-IO incremental decoder.

A frame is a 4-byte big-endian length followed by that many bytes. The decoder is fed
whatever chunks the transport delivers (one byte at a time works) and yields complete
frames. The length is checked against the limit *before* anything is buffered for it, and
buffer memory grows only with bytes actually received, so a peer claiming a 2 GiB frame and
then stalling costs us nothing.

This module is the one place the 4-byte header is written (:func:`frame_header`) and read
(:func:`parse_frame_header`, with its limit check): the daemon's streaming reader
(``peerd.net.framing``) uses both, so the format and its limits cannot drift apart. It does
no I/O and must not: the transport owns sockets and deadlines.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from peerd.core.reasons import Reason
from peerd.protocol.errors import ProtocolError
from peerd.protocol.limits import (
    FRAME_HEADER_LEN,
    MAX_CONTROL_FRAME_LEN,
    MAX_FRAME_LEN_CEILING,
)

_HEADER = struct.Struct(">I")


class FrameTooLargeError(ProtocolError):
    """A length prefix above the reader's limit. The body was not read, so the stream is
    desynchronised: the reader must stop reading it (reset it where the transport can)."""

    def __init__(self, length: int, max_len: int) -> None:
        super().__init__(Reason.TOO_LARGE, f"frame of {length} bytes exceeds limit {max_len}")
        self.length = length
        self.max_len = max_len


def parse_frame_header(header: bytes | bytearray | memoryview, max_len: int) -> int:
    """The body length a 4-byte prefix announces, refused before any of the body is read or
    allocated if it exceeds ``max_len`` (inclusive limit): :class:`FrameTooLargeError`."""
    if len(header) != FRAME_HEADER_LEN:
        raise ValueError(f"a frame header is {FRAME_HEADER_LEN} bytes, not {len(header)}")
    (length,) = _HEADER.unpack(header)
    if length > max_len:
        raise FrameTooLargeError(length, max_len)
    return int(length)


def frame_header(length: int) -> bytes:
    """The 4-byte prefix for a frame body of ``length`` bytes."""
    if not 0 <= length <= MAX_FRAME_LEN_CEILING:
        raise ValueError(f"frame length {length} out of range")
    return _HEADER.pack(length)


def encode_frame(body: bytes | bytearray | memoryview) -> bytes:
    """One frame as a single bytes object (copies ``body``; see :func:`frame_parts`)."""
    return frame_header(len(body)) + bytes(body)


def frame_parts(parts: Iterable[bytes | memoryview]) -> list[bytes | memoryview]:
    """Header plus the unchanged parts, for vectored writes that never copy a payload."""
    items = list(parts)
    total = sum(len(p) for p in items)
    return [frame_header(total), *items]


def _alloc(n: int) -> npt.NDArray[np.uint8]:
    # One allocation of the (already bounded) claimed length. Large ones are fresh anonymous
    # mappings whose pages the kernel commits only when written, so physical memory still
    # follows bytes received (to within a huge page), not bytes claimed. numpy asks for huge
    # pages, which makes the fill ~3x cheaper than a bytearray's page faults (measured).
    return np.empty(n, dtype=np.uint8)


class FrameDecoder:
    """Incremental decoder: ``feed(chunk)`` returns the frames completed by that chunk.

    ``max_frame_len`` is the largest frame this connection may carry; the daemon sets it to
    the Entry limit derived from its model schema (:func:`entry_frame_limit`), and message
    decoding separately keeps non-Entry frames under :data:`MAX_CONTROL_FRAME_LEN`.
    Frames are returned as writable memoryviews over buffers the decoder no longer uses.
    After a :class:`ProtocolError` the stream is desynchronised: the decoder stays failed.
    """

    def __init__(self, max_frame_len: int = MAX_CONTROL_FRAME_LEN) -> None:
        if not 0 < max_frame_len <= MAX_FRAME_LEN_CEILING:
            raise ValueError(f"max_frame_len {max_frame_len} out of range")
        self._max = max_frame_len
        self._header = bytearray()
        self._body: npt.NDArray[np.uint8] | None = None
        self._filled = 0
        self._need = 0
        self._failed: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for the frame in progress (for per-connection memory accounting)."""
        return len(self._header) + self._filled

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[memoryview]:
        if self._failed is not None:
            raise self._failed
        view = memoryview(chunk).cast("B")
        frames: list[memoryview] = []
        pos = 0
        n = len(view)
        while pos < n:
            if self._body is None:
                take = min(FRAME_HEADER_LEN - len(self._header), n - pos)
                self._header += view[pos : pos + take]
                pos += take
                if len(self._header) < FRAME_HEADER_LEN:
                    break
                try:
                    length = parse_frame_header(self._header, self._max)
                except FrameTooLargeError as exc:
                    self._failed = exc
                    raise
                finally:
                    self._header.clear()
                self._body = _alloc(length)
                self._filled = 0
                self._need = length
            take = min(self._need - self._filled, n - pos)
            body = self._body
            body[self._filled : self._filled + take] = np.frombuffer(
                view[pos : pos + take], dtype=np.uint8
            )
            self._filled += take
            pos += take
            if self._filled == self._need:
                frames.append(body.data)
                self._body = None
                self._filled = 0
        return frames

    def close(self) -> None:
        """End of stream: a partial frame left over is a truncated message."""
        if self._failed is not None:
            raise self._failed
        if self._header or self._body is not None:
            self._failed = ProtocolError(
                Reason.MALFORMED, f"stream ended inside a frame ({self.buffered} bytes buffered)"
            )
            raise self._failed
