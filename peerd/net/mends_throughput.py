"""The throughput mends for py-libp2p 0.8.1's Noise + Yamux data path (mends 10 to 13 of
``docs/transport.md``'s defect table; profile and figures in its section "Where the time
of a 44 MB transfer goes"):

10. Yamux flow control sends a WINDOW_UPDATE for (nearly) every read, its window stays at
    the spec's initial 256 KiB on a fast link (its auto-tuning only grows it when updates
    come within 4 RTTs, which a Python receiver on loopback never manages), and a writer
    that runs out of window polls every 10 ms: once a stream's reader has consumed the
    spec's initial 256 KiB, it announces a receive window of :data:`RECEIVE_WINDOW` with a
    WINDOW_UPDATE (the spec's way: the initial window is assumed, a larger one announced),
    and credit is returned only once half of the window has been read (go-yamux's
    hysteresis). A stream whose reader waits (a session queued for a receive slot) keeps
    the 256 KiB window, so what waits unread stays as small as before;
11. every 64 KiB Yamux frame (12 + 65524 bytes) is one write down the stack and does not
    fit one Noise message (65519 bytes of plaintext), so it becomes two Noise messages and
    two ``send`` calls: a write is cut into frames up to :data:`WRITE_BATCH_LEN` at a time,
    they are encrypted into full Noise messages and handed to TCP as one buffer;
12. the Noise reader makes two ``recv`` calls per message (its 2-byte length, then its
    body): it reads :data:`NOISE_READ_LEN` at a time into a buffer and cuts messages out
    of it;
13. the secure session copies each message through a fresh ``BytesIO`` and every read
    through a ``bytearray`` and back to ``bytes``, and Yamux's ``read_exactly`` adds two
    copies more: both keep one ``bytearray`` of pending plaintext and hand out exactly
    what was asked.

Nothing here changes what travels on the wire beyond what the specs allow: Noise messages
stay at most 65535 bytes, Yamux data frames at most 64 KiB, and a window grows only by a
WINDOW_UPDATE. The mends apply per connection (a stream follows its connection):
:func:`set_enabled` decides for connections made afterwards, so
``benchmarks/bench_transport.py`` can time py-libp2p's own path beside the mended one in
the same run. This module must not hold
a host, a connection or a stream, nor open sockets (that is :mod:`peerd.net.transport`).
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from libp2p.io.exceptions import ConnectionClosedError, IncompleteReadError
from libp2p.security.noise import io as _noise_io
from libp2p.security.secure_session import SecureSession
from libp2p.stream_muxer.exceptions import MuxedStreamError
from libp2p.stream_muxer.yamux import yamux as _yamux

#: Receive window a Yamux stream announces once its reader has consumed the initial 256 KiB
#: (mend 10). Threat it bounds: the bytes one stream's peer may have in flight that we hold
#: unread, i.e. memory per stream whose reader stalls mid-transfer (a reader that never
#: consumed 256 KiB, e.g. a session waiting for a receive slot, holds at most 256 KiB, as
#: before). py-libp2p's own auto-tuning allowed 16 MiB; 4 MiB lets a writer run about
#: 30 ms ahead of a receiver at 125 MB/s, so a busy receiver's scheduling delay does not
#: stall it.
RECEIVE_WINDOW = 4 * 1024 * 1024
#: The most bytes one write hands to the secure channel at once (mend 11): 16 full frames.
WRITE_BATCH_LEN = 16 * (_yamux.MAX_MESSAGE_SIZE - _yamux.HEADER_SIZE)
#: Largest ``recv`` of the Noise reader (mend 12).
NOISE_READ_LEN = 256 * 1024
#: Payload of one Yamux data frame (py-libp2p's and go-yamux's 64 KiB, header included).
_FRAME_PAYLOAD = _yamux.MAX_MESSAGE_SIZE - _yamux.HEADER_SIZE
_MAX_PLAINTEXT = _noise_io.MAX_PLAINTEXT_LENGTH  # 65535 - 16 (Poly1305 tag)
_NOISE_LEN = _noise_io.SIZE_NOISE_MESSAGE_LEN  # 2-byte big-endian length prefix
_HEADER = struct.Struct(_yamux.YAMUX_HEADER_FORMAT)
#: The writer's poll while its send window is zero, and how long it waits (py-libp2p's).
_WINDOW_POLL_S = 0.01
_WINDOW_WAIT_S = 5.0

#: The shapes of the py-libp2p methods wrapped here (their exact signatures are libp2p's).
_Reads = Callable[..., Awaitable[bytes]]
_Does = Callable[..., Awaitable[None]]

_enabled = True
_applied = False
#: Attribute marking a connection or stream created while the mends were enabled.
_MARK = "_peerd_fast"


def set_enabled(on: bool) -> None:
    """Whether connections made from now on (and their streams) use mends 10 to 14; those
    made before keep what they started with. On by default; the benchmark turns it off
    for its "before" case, to time py-libp2p's own path."""
    global _enabled
    _enabled = on


def _fast(obj: object) -> bool:
    return bool(getattr(obj, _MARK, False))


def _mark_on_init(cls: type, inherit: str | None = None) -> None:
    """Instances of ``cls`` record whether the mends were enabled when they were made (or,
    with ``inherit``, take the record of that attribute: a stream, its connection's)."""
    original = getattr(cls, "__init__")  # noqa: B009 - mypy: __init__ via a type is unsound

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        parent = getattr(self, inherit, None) if inherit else None
        setattr(self, _MARK, _enabled if parent is None else _fast(parent))

    setattr(cls, "__init__", init)  # noqa: B010


# --- mend 10: Yamux flow control ------------------------------------------------------------


def take_credit(self: Any, bytes_read: int) -> int:
    """go-yamux's ``sendWindowUpdate``: top the receive window up to its target once at
    least half of it has been consumed; the credit to announce (0: none yet). The target is
    the spec's 256 KiB until the reader has consumed that much, RECEIVE_WINDOW after.
    ``recv_window + buffered`` never exceeds the target, so the bytes held for this stream
    stay within it. No await: atomic under trio without ``window_lock`` (which py-libp2p
    never holds across an await either)."""
    consumed = self.__dict__.get("_peerd_consumed", 0) + bytes_read
    self._peerd_consumed = consumed
    target = RECEIVE_WINDOW if consumed >= _yamux.DEFAULT_WINDOW_SIZE else (
        _yamux.DEFAULT_WINDOW_SIZE)
    buffered = len(self.conn.stream_buffers.get(self.stream_id, b""))
    delta = target - (self.recv_window + buffered)
    if delta < target // 2:
        return 0
    self.recv_window += delta
    return int(delta)


async def _return_credit(self: Any, *, bytes_read: int = 0) -> None:
    async with self.window_lock:
        delta = take_credit(self, bytes_read)
    if delta:
        # Never under window_lock: the reader of inbound updates needs it (py-libp2p's rule).
        await self.send_window_update(delta, skip_lock=True)


def _wrap_credit(original: _Does) -> _Does:
    async def credit(self: Any, *, bytes_read: int = 0) -> None:
        if _fast(self):
            await _return_credit(self, bytes_read=bytes_read)
        else:
            await original(self, bytes_read=bytes_read)
    return credit


# --- mend 11: whole Noise messages, one TCP write per batch ---------------------------------


async def _wait_for_window(stream: Any) -> None:
    """py-libp2p's wait for a WINDOW_UPDATE and its 5 s limit. py-libp2p records no event
    for an update, so it polls every 10 ms; a WINDOW_UPDATE read by mend 14
    (:mod:`peerd.net.mends_throughput_rx`) sets ``_peerd_window`` and wakes the writer at
    once. The poll stays: it sees a close or reset, which py-libp2p signals to nobody."""
    with trio.move_on_after(_WINDOW_WAIT_S):
        while True:
            async with stream.window_lock:
                if stream.send_window > 0 or stream.closed:
                    return
            # No await since the check: no update can come between it and the event
            stream._peerd_window = event = trio.Event()
            with trio.move_on_after(_WINDOW_POLL_S):
                await event.wait()
    raise MuxedStreamError("Timed out waiting for window update after 5 seconds.")


def _wrap_stream_write(original: _Does) -> _Does:
    async def write(self: Any, data: bytes) -> None:
        if not _fast(self):
            await original(self, data)
            return
        if self.send_closed:
            raise MuxedStreamError("Stream is closed for sending")
        view = memoryview(data)
        sent, total = 0, len(view)
        while sent < total:
            async with self.rw_lock.write_lock():
                if self.send_closed:
                    raise MuxedStreamError("Stream is closed for sending")
                async with self.window_lock:
                    if self.closed:
                        raise MuxedStreamError("Stream is closed")
                    n = min(self.send_window, total - sent, WRITE_BATCH_LEN)
                    self.send_window -= max(n, 0)
            if n <= 0:
                await _wait_for_window(self)
                continue
            batch = bytearray()
            for lo in range(sent, sent + n, _FRAME_PAYLOAD):
                hi = min(lo + _FRAME_PAYLOAD, sent + n)
                batch += _HEADER.pack(0, _yamux.TYPE_DATA, 0, self.stream_id, hi - lo)
                batch += view[lo:hi]
            # Frames go down whole under the connection's write lock, so they never
            # interleave with another stream's.
            await self.conn._write_frame(batch)
            sent += n
    return write


def _wrap_noise_write(original: _Does) -> _Does:
    async def write_msg(self: Any, msg: bytes, prefix_encoded: bool = False) -> None:
        if not _fast(self) or prefix_encoded or len(msg) <= _MAX_PLAINTEXT:
            await original(self, bytes(msg), prefix_encoded)
            return
        view = memoryview(msg)
        out = bytearray()
        for lo in range(0, len(view), _MAX_PLAINTEXT):
            # noiseprotocol insists on bytes
            sealed = self.encrypt(bytes(view[lo:lo + _MAX_PLAINTEXT]))
            out += len(sealed).to_bytes(_NOISE_LEN, "big")
            out += sealed
        await self.read_writer.read_write_closer.write(out)
    return write_msg


# --- mend 12: the Noise reader reads in bulk ------------------------------------------------


def _wrap_noise_read(original: _Reads) -> _Reads:
    async def read_msg(self: Any, prefix_encoded: bool = False) -> bytes:
        if not _fast(self) or prefix_encoded:
            return await original(self, prefix_encoded)
        buf: bytearray = self.__dict__.setdefault("_peerd_rbuf", bytearray())
        conn = self.read_writer.read_write_closer
        while True:
            if len(buf) >= _NOISE_LEN:
                end = _NOISE_LEN + int.from_bytes(buf[:_NOISE_LEN], "big")
                if len(buf) >= end:
                    with memoryview(buf) as view:
                        sealed = bytes(view[_NOISE_LEN:end])
                    del buf[:end]  # from the front: CPython moves a pointer, not the bytes
                    return bytes(self.decrypt(sealed))
                want = end - len(buf)
            else:
                want = _NOISE_LEN - len(buf)
            chunk = await conn.read(max(want, NOISE_READ_LEN))
            if not chunk:
                raise IncompleteReadError(
                    f"Connection closed during read operation: expected {want} more bytes "
                    f"but received {len(buf)} bytes",
                    expected_bytes=len(buf) + want, received_bytes=len(buf))
            buf += chunk
    return read_msg


# --- mend 13: the secure session and Yamux's read_exactly copy less -------------------------


def _wrap_session_read(original: _Reads) -> _Reads:
    async def read(self: Any, n: int | None = None) -> bytes:
        if not _fast(self):
            return await original(self, n)
        if n == 0:
            return b""
        pending: bytearray = self.__dict__.setdefault("_peerd_pending", bytearray())
        if n is None:
            if pending:
                data = bytes(pending)
                pending.clear()
                return data
            msg = await self.conn.read_msg()
            if msg == b"":
                raise ConnectionClosedError("Connection closed")
            return bytes(msg)
        while len(pending) < n:
            msg = await self.conn.read_msg()
            if msg == b"":  # as py-libp2p: what has arrived, else the error
                if pending:
                    data = bytes(pending)
                    pending.clear()
                    return data
                raise ConnectionClosedError("Connection closed")
            if not pending and len(msg) == n:
                return bytes(msg)
            pending += msg
        with memoryview(pending) as view:
            data = bytes(view[:n])
        del pending[:n]
        return data
    return read


def _wrap_read_exactly(original: _Reads) -> _Reads:
    async def read_exactly(reader: Any, n: int, *args: Any, **kwargs: Any) -> bytes:
        if not _fast(reader):
            return await original(reader, n, *args, **kwargs)
        data: bytes = await reader.read(n)
        if len(data) == n:
            return data
        # Short (the connection ended): py-libp2p's own loop and error.
        return await original(_Prefixed(reader, data), n, *args, **kwargs)
    return read_exactly


class _Prefixed:
    """A reader that first returns ``head``, then reads from ``reader`` (for the short
    read's fallback to py-libp2p's ``read_exactly``, which raises its error)."""

    def __init__(self, reader: Any, head: bytes) -> None:
        self._reader, self._head = reader, head

    async def read(self, n: int | None = None) -> bytes:
        if self._head:
            head, self._head = self._head, b""
            return head
        data: bytes = await self._reader.read(n)
        return data


def apply() -> None:
    """Install mends 10 to 13 (idempotent; :func:`peerd.net.mends.apply_library_mends`)."""
    global _applied
    if _applied:
        return
    stream_cls, muxer_cls = _yamux.YamuxStream, _yamux.Yamux
    writer_cls = _noise_io.NoiseTransportReadWriter
    for cls in (muxer_cls, writer_cls, SecureSession):
        _mark_on_init(cls)
    _mark_on_init(stream_cls, inherit="conn")
    patches: list[tuple[object, str, Callable[[Any], Any]]] = [
        (stream_cls, "_auto_tune_and_send_window_update", _wrap_credit),  # 10
        (stream_cls, "write", _wrap_stream_write),  # 11
        (writer_cls, "write_msg", _wrap_noise_write),  # 11
        (writer_cls, "read_msg", _wrap_noise_read),  # 12
        (SecureSession, "read", _wrap_session_read),  # 13
        (_yamux, "read_exactly", _wrap_read_exactly),  # 13
    ]
    for owner, name, wrap in patches:
        setattr(owner, name, wrap(getattr(owner, name)))
    _applied = True
