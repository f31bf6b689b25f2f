"""Mend 14 (``peerd.net.mends_throughput_rx``): a mended receiver delivers flag-less DATA
frames out of the Noise plaintext itself and hands every other frame to py-libp2p's own
code; a peer that breaks the Yamux rules mid-frame gets a clean error, never a hang.

Real hosts on 127.0.0.1. The hostile peer is a mended host that writes raw Yamux bytes into
its secure session under a stream it opened (``Yamux._write_frame``). The interop with
py-libp2p's own path, both ways and at every boundary size, is
tests/net/test_mends_throughput.py's. Nothing here is timed.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
from libp2p.stream_muxer.yamux import yamux

from peerd.net import mends_throughput
from peerd.net.mends import abort, socket_of
from peerd.net.transport import (
    Stream,
    StreamClosedError,
    TransportError,
    read_frame,
    write_frame,
)
from peerd.protocol.frames import frame_header
from tests.net.hosts import host, run

LIMIT = 16 * 1024 * 1024
_HEADER = struct.Struct(yamux.YAMUX_HEADER_FORMAT)


def muxed(stream: Stream) -> Any:
    """The py-libp2p Yamux stream under a peerd Stream."""
    return stream._raw.muxed_stream  # type: ignore[attr-defined]


def data_frame(sid: int, length: int, body: bytes = b"", flags: int = 0) -> bytes:
    """A raw Yamux DATA frame: a header announcing ``length`` bytes, then ``body``."""
    return _HEADER.pack(0, yamux.TYPE_DATA, flags, sid, length) + body


@dataclass
class Seen:
    """What B's handler saw: the frames it read, the error that ended them, B's muxer and
    the raw frames B wrote."""

    ready: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    frames: list[bytes] = field(default_factory=list)
    error: Exception | None = None
    muxer: Any = None
    written: list[bytes] = field(default_factory=list)

    async def handler(self, stream: Stream) -> None:
        self.muxer = muxed(stream).conn
        original = self.muxer._write_frame

        async def recording(data: bytes) -> None:
            self.written.append(bytes(data))
            await original(data)

        self.muxer._write_frame = recording
        self.ready.set()
        try:
            while True:
                self.frames.append(bytes(await read_frame(stream, LIMIT)))
        except TransportError as e:
            self.error = e
        finally:
            self.done.set()


async def _opened(seen: Seen, s: Stream, announce: int) -> tuple[Any, int]:
    """A's muxer and stream id, once B's handler reads a peerd frame of ``announce`` bytes."""
    await s.write(frame_header(announce))
    await seen.ready.wait()
    return muxed(s).conn, muxed(s).stream_id


def test_the_mended_reader_delivers_data_frames_itself(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """py-libp2p's body read runs for no DATA frame of an open stream (it ran once per
    64 KiB frame before), and the bytes still cross intact."""
    body_reads: list[int] = []
    wrapped = yamux.Yamux._read_data_body

    async def counting(self: Any, length: int) -> bytes:
        body_reads.append(length)
        data: bytes = await wrapped(self, length)
        return data

    monkeypatch.setattr(yamux.Yamux, "_read_data_body", counting)
    seen = Seen()

    async def body() -> None:
        async with host(seen.handler) as b, host() as a, \
                a.open_stream(b.peer_id, b.listen_addrs) as s:
            payload = os.urandom(3 * 1024 * 1024 + 7)
            await write_frame(s, payload)
            await s.close_write()
            await seen.done.wait()
            assert seen.frames == [payload]
            assert isinstance(seen.error, StreamClosedError)

    run(body)
    assert body_reads == []


def test_a_flagged_data_frame_goes_to_py_libp2p_in_order() -> None:
    """A DATA frame with FIN and a 12-byte body (the size of a header: py-libp2p's body
    read must not be taken for a header read) after fast-path frames: every byte arrives in
    order, then the end of the stream."""
    seen = Seen()

    async def body() -> None:
        async with host(seen.handler) as b, host() as a, \
                a.open_stream(b.peer_id, b.listen_addrs) as s:
            payload = os.urandom(200_000 + 12)
            conn, sid = await _opened(seen, s, len(payload))
            await s.write(payload[:-12])
            await conn._write_frame(data_frame(sid, 12, payload[-12:], yamux.FLAG_FIN))
            await seen.done.wait()
            assert seen.frames == [payload]
            assert isinstance(seen.error, StreamClosedError)

    run(body)


def test_a_data_frame_over_the_window_is_a_protocol_error() -> None:
    """B answers GO_AWAY (protocol error) and tears the connection down: its reader gets an
    error and A's muxer ends. py-libp2p alone logs a warning and takes the bytes."""
    seen = Seen()

    async def body() -> None:
        async with host(seen.handler) as b, host() as a, \
                a.open_stream(b.peer_id, b.listen_addrs) as s:
            conn, sid = await _opened(seen, s, 1 << 20)
            over = yamux.DEFAULT_WINDOW_SIZE + 1  # B never announced more than the initial
            await conn._write_frame(data_frame(sid, over, os.urandom(1000)))
            await seen.done.wait()
            assert isinstance(seen.error, TransportError)
            assert seen.frames == []
            go_away = _HEADER.pack(0, yamux.TYPE_GO_AWAY, 0, 0, yamux.GO_AWAY_PROTOCOL_ERROR)
            assert go_away in seen.written
            await conn.event_shutting_down.wait()
            assert seen.muxer.event_shutting_down.is_set()

    run(body)


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_a_connection_that_ends_mid_frame_fails_the_reader(how: str) -> None:
    """A sends a DATA header and part of its body, then its socket is shut down (B reads
    EOF) or closed with SO_LINGER 0 (B reads a TCP RST): B's reader gets an error, not the
    partial frame and not a hang."""
    seen = Seen()

    async def body() -> None:
        async with host(seen.handler) as b, host() as a, \
                a.open_stream(b.peer_id, b.listen_addrs) as s:
            conn, sid = await _opened(seen, s, 1 << 20)
            await conn._write_frame(data_frame(sid, 65_524, os.urandom(1000)))
            sock = socket_of(conn)
            assert sock is not None
            if how == "fin":
                abort(sock)
            else:
                raw: Any = sock  # a trio socket: setsockopt takes the struct's bytes
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                raw.close()
            await seen.done.wait()
            assert isinstance(seen.error, TransportError)
            assert seen.frames == []
            await seen.muxer.event_shutting_down.wait()

    run(body)


def test_a_data_frame_that_stops_mid_body_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """py-libp2p's DATA body timeout still holds (shortened here through its own
    PY_YAMUX_DATA_READ_TIMEOUT): a body that stops arriving ends the connection."""
    monkeypatch.setenv("PY_YAMUX_DATA_READ_TIMEOUT", "0.5")
    seen = Seen()

    async def body() -> None:
        async with host(seen.handler) as b, host() as a, \
                a.open_stream(b.peer_id, b.listen_addrs) as s:
            conn, sid = await _opened(seen, s, 1 << 20)
            await conn._write_frame(data_frame(sid, 65_524, os.urandom(1000)))
            await seen.done.wait()  # the frame deadline of read_frame is 30 s and more
            assert isinstance(seen.error, TransportError)
            assert seen.muxer.event_shutting_down.is_set()

    run(body, deadline_s=20)


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_mend_14_follows_the_switch(on: bool) -> None:
    """A connection made with the throughput mends off keeps py-libp2p's reader on both
    ends (the benchmark's "before" case); one made with them on is read the mended way."""
    b_muxers: list[Any] = []

    async def echo(stream: Stream) -> None:
        b_muxers.append(muxed(stream).conn)
        await write_frame(stream, await read_frame(stream, LIMIT))

    async def body() -> None:
        async with host(echo) as b, host() as a:
            mends_throughput.set_enabled(on)
            try:
                await a.connect(b.peer_id, b.listen_addrs)
            finally:
                mends_throughput.set_enabled(True)
            async with a.open_stream(b.peer_id, b.listen_addrs) as s:
                payload = os.urandom(300_000)
                await write_frame(s, payload)
                assert bytes(await read_frame(s, LIMIT)) == payload
                for muxer in (muxed(s).conn, b_muxers[0]):
                    ref = getattr(muxer.secured_conn, "_peerd_muxer", None)
                    assert (ref() if ref is not None else None) is (muxer if on else None)

    run(body)


def test_streams_interleaved_on_one_connection_each_cross_intact() -> None:
    """Frames of several streams interleave on one connection: each body goes to its own
    stream, each window is its own."""

    async def body() -> None:
        async with host(_echo) as b, host() as a:
            payloads = [os.urandom(n) for n in (1_500_000, 700_001, 65_536, 2_000_003)]

            async def one(payload: bytes) -> None:
                async with a.open_stream(b.peer_id, b.listen_addrs) as s:
                    await write_frame(s, payload)
                    assert bytes(await read_frame(s, LIMIT)) == payload

            async with trio.open_nursery() as nursery:
                for payload in payloads:
                    nursery.start_soon(one, payload)

    run(body)


async def _echo(stream: Stream) -> None:
    await write_frame(stream, await read_frame(stream, LIMIT))


def test_a_writer_out_of_window_is_woken_by_the_window_update(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a wake-up, a writer out of window finds a WINDOW_UPDATE only by polling
    (py-libp2p: every 10 ms, each poll a stall). With the poll pushed past the 5 s limit
    of a wait for window, several windows' worth crosses only if every WINDOW_UPDATE the
    mended reader takes wakes the writer."""
    monkeypatch.setattr(mends_throughput, "_WINDOW_POLL_S", 3600.0)
    seen = Seen()

    async def body() -> None:
        async with host(seen.handler) as b, host() as a, \
                a.open_stream(b.peer_id, b.listen_addrs) as s:
            payload = os.urandom(3 * mends_throughput.RECEIVE_WINDOW + 5)
            await write_frame(s, payload)
            await s.close_write()
            await seen.done.wait()
            assert seen.frames == [payload]

    run(body)
