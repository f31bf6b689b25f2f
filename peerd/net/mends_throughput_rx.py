"""Mend 14 of ``docs/transport.md``'s defect table: py-libp2p 0.8.1's Yamux reader handles
every DATA frame on its own, and that per-frame work bounds a receiver's throughput.

For each 64 KiB frame, ``Yamux.handle_incoming`` reads the 12-byte header through
``read_exactly`` and the secure session, builds two dicts, a list and five f-strings for
debug logs that are off, reads the body under its own ``fail_after`` cancel scope (a
second pass through ``read_exactly`` and the session's buffer, one copy), takes
``streams_lock`` (a trip through trio's scheduler), appends the body to the stream's buffer
(another copy) and sets the stream's ``Event``, so the stream's reader wakes and takes its
own locks once per frame. Between two processes this is most of the receiver's CPU once
mends 10 to 13 have cut the rest (``benchmarks.profile_transport``).

The mend reads flag-less DATA frames for an open stream itself, straight out of the Noise
plaintext: at the muxer's header read it cuts frames out of the decrypted messages in
place, appends each body (or the part that has arrived) to the stream's buffer and sets its
event, without locks, and goes on to the next header; the stream's reader runs when the
muxer next waits for the socket, taking a few frames' bytes at once, and takes them (and
mend 10's credit) without ``NetStream``'s state lock, ``streams_lock`` or ``window_lock``
while the stream is open (:func:`_read_buffered`). A flag-less WINDOW_UPDATE for an open
stream is taken the same way, and it wakes the stream's writer at once: py-libp2p records
no event for it, so a writer out of window polled every 10 ms, and a fast sender ran out
of window often enough for those polls to leave the receiver idle (mend 11's wait,
``peerd.net.mends_throughput._wait_for_window``, now waits on ``_peerd_window``). Every
other frame (SYN, ACK, FIN, RST, PING, GO_AWAY, an empty or unknown-stream DATA frame, a
stream closed for receiving) is handed back, header and all, to py-libp2p's own code,
which handles it as before. The flow-control accounting stays exact: a frame longer than
the stream's receive window is a protocol error (GO_AWAY with the protocol error code,
then the connection is torn down, as go-yamux does; py-libp2p would log and clamp), and
the window shrinks by each part of a body as it is delivered, so mend 10 never credits
bytes still on their way. A body that stops arriving mid-frame still ends the connection
after py-libp2p's ``DATA_READ_TIMEOUT`` (60 s; here between half of it and all of it, so
the deadline is not moved for every message), and a connection that ends mid-frame ends like
one that ends between frames: its streams' readers get an error, never the partial frame
as a whole one.

What travels on the wire does not change. The mend applies to connections whose muxer
and secure session were made with the throughput mends enabled
(:func:`peerd.net.mends_throughput.set_enabled`). It must not hold a host, a connection
or a stream, nor open sockets (:mod:`peerd.net.transport`).
"""

from __future__ import annotations

import logging
import math
import struct
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from libp2p.io.exceptions import ConnectionClosedError
from libp2p.network.stream.net_stream import NetStream, StreamState
from libp2p.stream_muxer.yamux import yamux as _yamux

from peerd.net.mends_throughput import _fast, take_credit

logger = logging.getLogger("peerd.net.transport")

_HEADER = struct.Struct(_yamux.YAMUX_HEADER_FORMAT)
_HEADER_SIZE = _yamux.HEADER_SIZE
#: How long a GO_AWAY for a protocol error may wait for the connection's write lock and
#: the socket before the connection is torn down without it.
GO_AWAY_TIMEOUT_S = 1.0

_Reads = Callable[..., Awaitable[bytes]]

_applied = False


class WindowExceededError(Exception):
    """The peer sent more DATA on a stream than its receive window allowed."""


async def _read_msg(session: Any) -> bytes:
    """One decrypted Noise message (mend 12's reader); the connection's end is an error."""
    msg: bytes = await session.conn.read_msg()
    if msg == b"":
        raise ConnectionClosedError("Connection closed")
    return msg


async def _protocol_error(muxer: Any, message: str) -> None:
    """GO_AWAY (protocol error), best effort and bounded; the caller then raises, and
    py-libp2p's header-read error path tears the connection down."""
    logger.warning("peer %s: %s; closing the connection", muxer.peer_id, message)
    go_away = _HEADER.pack(0, _yamux.TYPE_GO_AWAY, 0, 0, _yamux.GO_AWAY_PROTOCOL_ERROR)
    with trio.move_on_after(GO_AWAY_TIMEOUT_S):
        try:
            await muxer._write_frame(go_away)
        except Exception as e:  # noqa: BLE001 - the connection is being torn down anyway
            logger.debug("GO_AWAY to %s failed: %r", muxer.peer_id, e)


def _stream_for(muxer: Any, version: int, typ: int, flags: int, sid: int, length: int
                ) -> Any:
    """The stream whose DATA frame the mend delivers itself, or None: py-libp2p's code
    handles the frame."""
    if version or typ != _yamux.TYPE_DATA or flags or not length:
        return None
    stream = muxer.streams.get(sid)
    if (stream is None or stream.recv_closed or stream.closed or stream.reset_received
            or sid not in muxer.stream_buffers or sid not in muxer.stream_events):
        return None
    return stream


async def _next_header(muxer: Any, session: Any) -> bytes:
    """Deliver flag-less DATA frames for open streams until another frame comes; return
    that frame's header (its body, if any, stays in the session's buffer for py-libp2p).

    ``chunk[pos:]`` holds the plaintext not yet consumed; what is left of it goes back to
    the session's buffer (mend 13's) whenever this returns or raises."""
    pending: bytearray = session.__dict__.setdefault("_peerd_pending", bytearray())
    chunk: bytes = bytes(pending)
    pending.clear()
    pos = 0
    stream: Any = None
    sid = remaining = 0
    body_timeout = _yamux._yamux_data_read_timeout()
    deadline = trio.CancelScope()  # for a body, py-libp2p's own fail_after per frame
    try:
        with deadline:
            while True:
                avail = len(chunk) - pos
                if remaining:  # in a body: deliver what has arrived
                    if not avail:
                        # Moved only when less than half of it is left: a body that stops
                        # arriving is cut after between half the timeout and all of it,
                        # and the deadline is not re-registered with trio per message
                        now = trio.current_time()
                        if not now + body_timeout / 2 <= deadline.deadline <= now + body_timeout:
                            deadline.deadline = now + body_timeout
                        chunk, pos = await _read_msg(session), 0
                        continue
                    take = min(remaining, avail)
                    buffer = muxer.stream_buffers.get(sid)
                    if buffer is not None:  # else the stream went away: drop its bytes
                        with memoryview(chunk) as view:
                            buffer += view[pos:pos + take]
                        stream.recv_window -= take
                        event = muxer.stream_events.get(sid)
                        if event is not None:
                            event.set()
                    pos += take
                    remaining -= take
                    continue
                if avail < _HEADER_SIZE:
                    if deadline.deadline != math.inf:  # between frames: no deadline
                        deadline.deadline = math.inf
                    if muxer.event_shutting_down.is_set():
                        # py-libp2p's loop ends after its next frame; let it read that
                        pending[:0], pos = chunk[pos:], len(chunk)
                        return await _inner_read_exactly(session, _HEADER_SIZE)
                    msg = await _read_msg(session)
                    chunk, pos = (chunk[pos:] + msg if avail else msg), 0
                    continue
                version, typ, flags, sid, length = _HEADER.unpack_from(chunk, pos)
                if typ == _yamux.TYPE_WINDOW_UPDATE and not (version or flags):
                    credited = muxer.streams.get(sid)
                    if credited is not None and not credited.closed:
                        # py-libp2p's own steps for it (the stream is open: nothing to
                        # finalize), and the stream's writer woken at once
                        credited.send_window += length
                        waiting = credited.__dict__.get("_peerd_window")
                        if waiting is not None:
                            waiting.set()
                        pos += _HEADER_SIZE
                        continue
                stream = _stream_for(muxer, version, typ, flags, sid, length)
                if stream is None:
                    pos += _HEADER_SIZE
                    return chunk[pos - _HEADER_SIZE:pos]
                if length > stream.recv_window:
                    await _protocol_error(
                        muxer, f"DATA frame of {length} bytes on stream {sid} exceeds its "
                        f"receive window ({stream.recv_window} bytes)")
                    raise WindowExceededError(f"stream {sid}: {length} > {stream.recv_window}")
                pos += _HEADER_SIZE
                remaining = length
    finally:
        if pos < len(chunk):  # back in front of anything py-libp2p's path buffered since
            pending[:0] = memoryview(chunk)[pos:]
    # Only the deadline ends the loop without returning or raising: a body stalled
    # (py-libp2p's header-read error path then tears the connection down, as its own
    # body read's timeout does)
    raise trio.TooSlowError(f"stream {sid}: {remaining} bytes of a DATA frame did not "
                            f"arrive within {body_timeout:g} s")


#: py-libp2p's ``read_exactly`` as mend 13 left it (set by :func:`apply`).
_inner_read_exactly: _Reads = getattr(_yamux, "read_exactly")  # noqa: B009 - not exported


async def _read_buffered(stream: Any, n: int) -> bytes | None:
    """Up to ``n`` bytes of what the muxer has buffered for an open ``stream``, waiting for
    them if there are none; None as soon as the stream is in any other state (closed,
    reset, half-closed by the peer, its connection shutting down): py-libp2p's own
    ``read`` then decides, with its locks and errors. The same steps as its
    ``read_stream`` and mend 10's credit, without three trips through trio's scheduler for
    ``NetStream``'s state lock, ``streams_lock`` and ``window_lock`` (none is held across an
    await by py-libp2p, so taking the bytes and the credit with no await between is as
    atomic as under them)."""
    conn, sid = stream.conn, stream.stream_id
    while True:
        if (stream.recv_closed or stream.closed or stream.reset_received
                or conn.event_shutting_down.is_set() or sid not in conn.streams):
            return None
        buffer = conn.stream_buffers.get(sid)
        if buffer is None:
            return None
        if buffer:
            if n >= len(buffer):
                data = bytes(buffer)
                buffer.clear()
            else:
                with memoryview(buffer) as view:
                    data = bytes(view[:n])
                del buffer[:n]
            credit = take_credit(stream, len(data))
            if credit:
                await stream.send_window_update(credit, skip_lock=True)
            return data
        event = conn.stream_events.get(sid)
        if event is None:
            return None
        await event.wait()
        if conn.stream_events.get(sid) is event:  # py-libp2p's own reset of the event
            conn.stream_events[sid] = trio.Event()


def _wrap_net_stream_read(original: _Reads) -> _Reads:
    async def read(self: Any, n: int | None = None) -> bytes:
        muxed = self.muxed_stream
        if (n is not None and n > 0 and isinstance(muxed, _yamux.YamuxStream) and _fast(muxed)
                and self._state not in (StreamState.ERROR, StreamState.RESET)):
            data = await _read_buffered(muxed, n)
            if data is not None:
                return data
        return await original(self, n)
    return read


def _wrap_read_exactly(original: _Reads) -> _Reads:
    async def read_exactly(reader: Any, n: int, *args: Any, **kwargs: Any) -> bytes:
        ref = getattr(reader, "_peerd_muxer", None)
        muxer = ref() if ref is not None else None
        if muxer is None or n != _HEADER_SIZE or muxer.__dict__.get("_peerd_in_body"):
            return await original(reader, n, *args, **kwargs)
        return await _next_header(muxer, reader)
    return read_exactly


def _wrap_read_data_body(original: _Reads) -> _Reads:
    async def read_data_body(self: Any, length: int) -> bytes:
        # A body py-libp2p reads itself (a frame the mend handed back) is not a header
        self._peerd_in_body = True
        try:
            return await original(self, length)
        finally:
            self._peerd_in_body = False
    return read_data_body


def _wrap_muxer_init(original: Callable[..., None]) -> Callable[..., None]:
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if _fast(self) and _fast(self.secured_conn):
            # The muxer's header reads on this session go through _next_header (a weak
            # reference: no cycle keeps a closed connection's buffers alive until a GC)
            self.secured_conn._peerd_muxer = weakref.ref(self)
    return init


def apply() -> None:
    """Install mend 14 (idempotent; after :func:`peerd.net.mends_throughput.apply`, whose
    marks and buffers it uses)."""
    global _applied, _inner_read_exactly
    if _applied:
        return
    muxer_cls = _yamux.Yamux
    _inner_read_exactly = getattr(_yamux, "read_exactly")  # noqa: B009 - not exported
    setattr(_yamux, "read_exactly", _wrap_read_exactly(_inner_read_exactly))  # noqa: B010
    setattr(muxer_cls, "_read_data_body",  # noqa: B010
            _wrap_read_data_body(getattr(muxer_cls, "_read_data_body")))  # noqa: B009
    setattr(muxer_cls, "__init__",  # noqa: B010
            _wrap_muxer_init(getattr(muxer_cls, "__init__")))  # noqa: B009
    setattr(NetStream, "read", _wrap_net_stream_read(NetStream.read))  # noqa: B010
    _applied = True
