"""Length-prefixed frames over any byte stream, with a deadline on every frame.

This module knows nothing about libp2p: :mod:`peerd.net.stream` subclasses
:class:`FramedStream` for libp2p streams, and :mod:`peerd.net.transport` re-exports
everything here, so callers keep importing from ``peerd.net.transport``. Keeping the
framing apart lets it be tested and benchmarked over any stream, e.g. raw TCP, with the
exact same code path.

The frame format is not defined here: the 4-byte length prefix is written by
:func:`peerd.protocol.frames.frame_header` and read by
:func:`peerd.protocol.frames.parse_frame_header`, which checks it against the caller's limit
before any of the body is read. This module owns only the streaming around it: deadlines,
a minimum rate for frames that hold a shared receive slot (:class:`RateFloor`), bounded
reads (memory grows only with the bytes that actually arrive), sinks and vectored writes
that never join a large frame. It must not interpret frame bodies (that is
``peerd.protocol``) nor know the session order (``peerd.protocol.session``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Protocol

import trio

from peerd.core.reasons import Reason
from peerd.protocol import frames
from peerd.protocol.errors import ProtocolError
from peerd.protocol.frames import frame_header, parse_frame_header
from peerd.protocol.limits import FRAME_HEADER_LEN, MAX_FRAME_LEN_CEILING
from peerd.store.sinks import MemorySink

#: Waiting for a frame to *start* (header bytes); bounds an idle peer holding a stream.
READ_TIMEOUT_S = 30.0
#: Waiting to push the first bytes of a frame; bounds a peer that never opens its window.
WRITE_TIMEOUT_S = 30.0
#: Slowest sustained rate we tolerate for a frame body; with the base timeout above it
#: gives each frame a deadline of base + len / rate, which defeats a trickling (slowloris)
#: peer without failing a 44 MB entry on a slow Wi-Fi link (44 MB at 256 KiB/s ~ 170 s).
MIN_TRANSFER_RATE_BPS = 256 * 1024
#: Slowest average rate at which a frame that holds one of the node's shared receive slots
#: (an entry, see peerd.net.gossip) may arrive, after RECEIVE_GRACE_S. Threat: a member that
#: trickles (or stalls) an entry keeps every other member waiting for the slot until the frame
#: deadline above, 30 s + len / rate per stream, and it may open 8 streams. Equal to
#: MIN_TRANSFER_RATE_BPS, so it cuts no link that the frame deadline lets through.
MIN_RECEIVE_RATE_BPS = MIN_TRANSFER_RATE_BPS
#: Credit before that floor applies: the header, TCP slow start, a sender busy for a moment.
#: A stream that sends nothing holds a slot this long; one at the floor, this + len / rate.
RECEIVE_GRACE_S = 10.0
#: Largest single read from the stream; memory for a frame grows only with bytes received.
READ_CHUNK_LEN = 1024 * 1024
#: Frames above this are received into their own anonymous mmap (see read_exactly).
LARGE_FRAME_LEN = READ_CHUNK_LEN

class TransportError(Exception):
    """Any failure on the wire; the caller drops the stream/peer and carries on."""


class TransportTimeoutError(TransportError):
    """A network await ran past its deadline."""


class StreamClosedError(TransportError):
    """The remote closed (EOF) or reset the stream."""


class FrameTooLargeError(TransportError, frames.FrameTooLargeError):
    """A length prefix exceeded the caller's limit; the body was not read.

    Both at once: a transport failure (callers that drop a stream on any
    :class:`TransportError` still do) and the protocol's refusal with reason ``too_large``
    (:class:`peerd.protocol.frames.FrameTooLargeError`, a ``ProtocolError``)."""


class ReceiveTooSlowError(TransportTimeoutError, ProtocolError):
    """A frame arrived below the minimum rate (:class:`RateFloor`); it was cut mid-body.

    Both at once: a transport timeout and the protocol's refusal with reason ``too_slow``
    (counted and audited like any refusal). The stream is desynchronised: reset it."""

    def __init__(self, message: str) -> None:
        ProtocolError.__init__(self, Reason.TOO_SLOW, message)


class FrameSink(Protocol):
    """Where a frame body goes as it arrives: memory (:class:`peerd.store.sinks.MemorySink`,
    the default) or a file (``peerd.store.spool.SpoolWriter``)."""

    def begin(self, length: int) -> None: ...

    def write(self, data: bytes | bytearray | memoryview) -> None: ...

    def finish(self) -> memoryview: ...

    def abort(self) -> None: ...


class RateFloor:
    """Cuts a frame read that falls below ``rate_bps`` on average after ``grace_s``.

    ::

        with RateFloor(rate_bps, grace_s, peer) as floor:
            frame = await io.recv(limit, sink=floor.sink(SpoolWriter(...)))

    Each chunk the sink is given moves the deadline to ``start + grace_s + received /
    rate_bps``: no polling, and a stream that keeps up never meets it. So a stream that
    stalls is cut after ``grace_s``, one at half the rate after about ``2 * grace_s``, and no
    frame of ``n`` bytes holds on for longer than ``grace_s + n / rate_bps``. Leaving the block
    past the deadline raises :class:`ReceiveTooSlowError`. It counts what reaches the sink,
    so it needs a reader that writes the body to its sink as it arrives
    (:meth:`FramedStream.read_exactly` does).
    """

    def __init__(self, rate_bps: float, grace_s: float, peer: str) -> None:
        if not rate_bps > 0:
            raise ValueError(f"rate_bps must be > 0, got {rate_bps}")
        self._rate, self._grace, self._peer = rate_bps, grace_s, peer
        self._start = 0.0
        self._scope = trio.CancelScope()
        self.received = 0

    def __enter__(self) -> RateFloor:
        self._start = trio.current_time()
        self._scope.deadline = self._start + self._grace
        self._scope.__enter__()
        return self

    def __exit__(self, etype: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # The scope swallows only its own cancellation, and that becomes our error: nothing
        # else is ever swallowed here.
        self._scope.__exit__(etype, exc, tb)
        if self._scope.cancelled_caught:
            raise ReceiveTooSlowError(
                f"{self._peer} sent {self.received} bytes in "
                f"{trio.current_time() - self._start:.1f} s, below {self._rate:g} B/s "
                f"after {self._grace:g} s") from None

    def add(self, n: int) -> None:
        self.received += n
        self._scope.deadline = self._start + self._grace + self.received / self._rate

    def sink(self, inner: FrameSink) -> FrameSink:
        """``inner``, counting what it is given against the floor."""
        return _FloorSink(inner, self)


class _FloorSink:
    def __init__(self, inner: FrameSink, floor: RateFloor) -> None:
        self._inner, self._floor = inner, floor

    def begin(self, length: int) -> None:
        self._inner.begin(length)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._inner.write(data)
        self._floor.add(len(data))

    def finish(self) -> memoryview:
        return self._inner.finish()

    def abort(self) -> None:
        self._inner.abort()


#: Called with each part's index once that part of a frame has been written.
AfterPart = Callable[[int], None]


class FramedStream(ABC):
    """A byte stream to one peer, plus framed I/O on top of it.

    Subclasses supply :meth:`read_some` and :meth:`write` (translating their library's
    errors into :class:`TransportError`); :meth:`send` / :meth:`recv` implement the gossip
    layer's ``FrameIO`` protocol (``peerd.net.gossip``): one frame per call.
    """

    #: Who is on the other end (for logs and errors); the transport sets the proven id.
    peer_id: str

    @abstractmethod
    async def read_some(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` (at least 1); raises :class:`StreamClosedError` at EOF."""

    @abstractmethod
    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data``; no deadline of its own, callers set one."""

    async def read_exactly(
        self, n: int, sink: FrameSink | None = None
    ) -> bytearray | memoryview:
        """Exactly ``n`` bytes; memory grows with what arrives, not with ``n``.

        A large frame goes into an anonymous ``mmap`` of exactly ``n`` bytes: its pages are
        committed only as bytes land in them (a peer that announces 44 MB and stalls costs
        what it sent), nothing is copied twice, and the whole buffer goes back to the OS the
        moment the last view of it is dropped. Joining a list of chunks instead held the
        frame twice at its peak, and a growing heap buffer left model-sized holes behind.
        With a ``sink`` the bytes go there chunk by chunk (to disk) and the sink's buffer is
        returned; it is aborted if the frame does not complete.
        """
        if n <= LARGE_FRAME_LEN and sink is None:
            buf = bytearray()
            while len(buf) < n:
                buf += await self.read_some(n - len(buf))
            return buf
        sink = sink or MemorySink()
        sink.begin(n)
        try:
            filled = 0
            while filled < n:
                chunk = await self.read_some(min(n - filled, READ_CHUNK_LEN))
                sink.write(chunk)
                filled += len(chunk)
            return sink.finish()
        except BaseException:
            sink.abort()
            raise

    async def send(
        self, parts: Sequence[bytes | bytearray | memoryview], after_part: AfterPart | None = None
    ) -> None:
        await write_frame_parts(self, parts, after_part=after_part)

    async def recv(self, max_len: int, sink: FrameSink | None = None) -> bytearray | memoryview:
        return await read_frame(self, max_len, sink=sink)


class TrioFramedStream(FramedStream):
    """peerd's framing over any trio byte stream (raw TCP, in-memory pairs): no libp2p."""

    def __init__(self, stream: trio.abc.Stream, peer_id: str) -> None:
        self._s = stream
        self.peer_id = peer_id

    async def read_some(self, max_bytes: int) -> bytes:
        data = await self._s.receive_some(max_bytes)
        if not data:
            raise StreamClosedError("EOF")
        return bytes(data)

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        await self._s.send_all(memoryview(data))


def _frame_deadline(base_s: float, length: int) -> float:
    return base_s + length / MIN_TRANSFER_RATE_BPS


async def read_frame(
    stream: FramedStream, max_len: int, *, timeout_s: float = READ_TIMEOUT_S,
    sink: FrameSink | None = None,
) -> bytearray | memoryview:
    """Read one length-prefixed frame.

    The length is checked against ``max_len`` before any of the body is read or allocated;
    an oversize prefix raises :class:`FrameTooLargeError` and the caller must reset the stream
    (it is desynchronised). The header waits at most ``timeout_s``; the body gets
    ``timeout_s + len / MIN_TRANSFER_RATE_BPS``. The body goes to ``sink`` if one is given.
    """
    if not 0 <= max_len <= MAX_FRAME_LEN_CEILING:
        raise ValueError(f"max_len {max_len} out of range")
    try:
        with trio.fail_after(timeout_s):
            header = await stream.read_exactly(FRAME_HEADER_LEN)
        try:
            length = parse_frame_header(header, max_len)
        except frames.FrameTooLargeError as e:
            raise FrameTooLargeError(e.length, e.max_len) from None
        with trio.fail_after(_frame_deadline(timeout_s, length)):
            return await stream.read_exactly(length, sink)
    except trio.TooSlowError as e:
        raise TransportTimeoutError(f"read from {stream.peer_id} timed out") from e


async def write_frame(
    stream: FramedStream,
    payload: bytes | bytearray | memoryview,
    *,
    timeout_s: float = WRITE_TIMEOUT_S,
) -> None:
    """Write one length-prefixed frame within ``timeout_s + len / MIN_TRANSFER_RATE_BPS``."""
    await write_frame_parts(stream, [payload], timeout_s=timeout_s)


async def write_frame_parts(
    stream: FramedStream,
    parts: Sequence[bytes | bytearray | memoryview],
    *,
    timeout_s: float = WRITE_TIMEOUT_S,
    after_part: AfterPart | None = None,
) -> None:
    """One frame whose body is ``parts`` in order, written without joining them first;
    ``after_part(i)`` runs once part ``i`` is written (the sender may release its pages)."""
    length = sum(len(p) for p in parts)
    header = frame_header(length)  # ValueError above the protocol's ceiling: no peer reads it
    try:
        with trio.fail_after(_frame_deadline(timeout_s, length)):
            # Separate writes: concatenating header + parts would copy a 44 MB entry.
            await stream.write(header)
            for i, part in enumerate(parts):
                if len(part):
                    await stream.write(part)
                if after_part is not None:
                    after_part(i)
    except trio.TooSlowError as e:
        raise TransportTimeoutError(f"write to {stream.peer_id} timed out") from e
