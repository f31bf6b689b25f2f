"""Mends 10 to 13 (``peerd.net.mends_throughput``): py-libp2p's Noise + Yamux data path with
a larger receive window announced by WINDOW_UPDATE, credit returned in halves of it, writes
batched into full Noise messages, and bulk reads. Real hosts on 127.0.0.1; the interop
tests run the other end in a child process (tests/net/echo_peer.py) with the mends off.
Nothing here is timed: speed is benchmarks/bench_transport.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from libp2p.security.noise.io import MAX_NOISE_MESSAGE_LEN
from libp2p.stream_muxer.yamux import yamux

from peerd.net import mends_throughput
from peerd.net.mends_throughput import RECEIVE_WINDOW, WRITE_BATCH_LEN
from peerd.net.transport import Stream, read_frame, write_frame
from tests.net.hosts import host, run

REPO = Path(__file__).resolve().parents[2]
#: Sizes around every boundary of the path: a Noise message's plaintext (65519), a Yamux
#: frame (65536 with its header), the initial window (256 KiB), a write batch, and more
#: than one receive window.
SIZES = (0, 1, 12, 65_507, 65_519, 65_520, 65_536, 65_537, 262_144, WRITE_BATCH_LEN + 1,
         RECEIVE_WINDOW + 12_345)
LIMIT = 16 * 1024 * 1024


def muxed(stream: Stream) -> Any:
    """The py-libp2p Yamux stream under a peerd Stream."""
    return stream._raw.muxed_stream  # type: ignore[attr-defined]


async def echo(stream: Stream) -> None:
    while True:
        await write_frame(stream, await read_frame(stream, LIMIT))


def test_frames_of_every_boundary_size_cross_intact() -> None:
    async def body() -> None:
        async with host(echo) as b, host() as a, a.open_stream(b.peer_id, b.listen_addrs) as s:
            for n in SIZES:
                payload = os.urandom(n)
                await write_frame(s, payload)
                assert bytes(await read_frame(s, LIMIT)) == payload, n

    run(body)


async def _held_unread(consume: int) -> tuple[int, Any, Any]:
    """A writes 2 windows' worth to B, whose reader consumes ``consume`` bytes (one frame)
    and then stops: (bytes B holds unread once A's send window is used up, A's stream, B's
    stream)."""
    streams: list[Stream] = []
    got = trio.Event()

    async def reader(stream: Stream) -> None:
        streams.append(stream)
        if consume:
            await read_frame(stream, LIMIT)
        got.set()
        await trio.sleep_forever()

    async with host(reader) as b, host() as a, a.open_stream(b.peer_id, b.listen_addrs) as s:
        sender = muxed(s)
        async with trio.open_nursery() as nursery:
            if consume:
                await write_frame(s, os.urandom(consume))
            nursery.start_soon(s.write, os.urandom(2 * RECEIVE_WINDOW))
            await got.wait()
            receiver = muxed(streams[0])
            # Every byte of credit has arrived once B's window is at 0; A may send no more.
            # py-libp2p signals no event for it, so this polls (the deadline bounds it).
            while receiver.recv_window > 0:  # noqa: ASYNC110
                await trio.sleep(0.01)
            assert sender.send_window == 0
            held = len(receiver.conn.stream_buffers[receiver.stream_id])
            nursery.cancel_scope.cancel()
    return held, sender, receiver


def test_a_stream_not_read_keeps_the_initial_window() -> None:
    """A session waiting for a receive slot reads nothing: its peer may not make it hold
    more than the spec's initial 256 KiB, as before the mend."""

    async def body() -> None:
        held, _, receiver = await _held_unread(0)
        assert 0 < held <= yamux.DEFAULT_WINDOW_SIZE
        assert receiver.recv_window == 0

    run(body)


def test_a_stream_being_read_announces_the_larger_window_by_window_update() -> None:
    """Once its reader consumed 256 KiB, B announces RECEIVE_WINDOW (A only learns of it
    from a WINDOW_UPDATE: it starts from the spec's 256 KiB), and A stops when it is used
    up: B then holds more than the initial window, and never more than RECEIVE_WINDOW."""

    async def body() -> None:
        held, _, receiver = await _held_unread(2 * yamux.DEFAULT_WINDOW_SIZE)
        assert RECEIVE_WINDOW // 2 < held <= RECEIVE_WINDOW
        assert receiver.recv_window == 0

    run(body)


def test_credit_is_returned_in_halves_of_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    updates: list[tuple[object, int]] = []
    original = yamux.YamuxStream.send_window_update

    async def recording(self: Any, increment: int, skip_lock: bool = False) -> None:
        updates.append((self, increment))
        await original(self, increment, skip_lock)

    monkeypatch.setattr(yamux.YamuxStream, "send_window_update", recording)
    total = 3 * RECEIVE_WINDOW + 1
    received: list[Any] = []

    async def sink(stream: Stream) -> None:
        received.append(muxed(stream))
        await read_frame(stream, LIMIT)
        await write_frame(stream, b"k")

    async def body() -> None:
        async with host(sink) as b, host() as a, a.open_stream(b.peer_id, b.listen_addrs) as s:
            await write_frame(s, os.urandom(total))
            assert bytes(await read_frame(s, 1)) == b"k"

    run(body)
    mine = [inc for who, inc in updates if who is received[0]]
    # Half of the initial window at a time until 256 KiB are read, then the growth to
    # RECEIVE_WINDOW, then halves of it: py-libp2p alone sent one per read.
    assert all(inc >= yamux.DEFAULT_WINDOW_SIZE // 2 for inc in mine)
    assert sum(1 for inc in mine if inc < RECEIVE_WINDOW // 2) <= 2
    assert len(mine) <= 3 + total // (RECEIVE_WINDOW // 2)


def test_writes_go_out_as_full_noise_messages_in_few_tcp_writes() -> None:
    async def body() -> None:
        async with host(echo) as b, host() as a, a.open_stream(b.peer_id, b.listen_addrs) as s:
            raw = muxed(s).conn.secured_conn.conn.read_writer.read_write_closer
            writes: list[bytes] = []
            original = raw.write

            async def recording(data: bytes) -> None:
                writes.append(bytes(data))
                await original(data)

            raw.write = recording
            n = 1024 * 1024
            await write_frame(s, os.urandom(n))
            raw.write = original
            assert len(bytes(await read_frame(s, LIMIT))) == n
            # Every Noise message within the spec's 65535 bytes, all but the last of each
            # batch full; py-libp2p alone made 2 messages and 2 writes per 64 KiB frame.
            stream = b"".join(writes)
            lengths = []
            while stream:
                length = int.from_bytes(stream[:2], "big")
                lengths.append(length)
                stream = stream[2 + length:]
            assert max(lengths) == MAX_NOISE_MESSAGE_LEN
            assert sum(1 for x in lengths if x < MAX_NOISE_MESSAGE_LEN) <= len(writes)
            assert len(writes) <= 2 * (n // WRITE_BATCH_LEN + 2)

    run(body)


@contextmanager
def echo_peer(*, unmended: bool) -> Iterator[tuple[str, list[str]]]:
    cmd = [sys.executable, str(REPO / "tests/net/echo_peer.py")]
    proc = subprocess.Popen(cmd + (["--unmended"] if unmended else []), cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        peer_id, port = proc.stdout.readline().split()
        yield peer_id, [f"/ip4/127.0.0.1/tcp/{port}"]
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            assert proc.wait(timeout=30) == 0
        finally:
            proc.kill()


@pytest.mark.parametrize("here_mended", [True, False], ids=["mended-to-plain", "plain-to-mended"])
def test_a_mended_host_and_py_libp2p_s_own_path_interoperate(here_mended: bool) -> None:
    """Each direction carries every boundary size: the mended side's batched writes are
    read by py-libp2p's own reader, its announced window honoured by py-libp2p's writer."""

    async def body() -> None:
        with echo_peer(unmended=here_mended) as (peer_id, addrs):
            mends_throughput.set_enabled(here_mended)
            try:
                async with host() as a:
                    await a.connect(peer_id, addrs)
                    mends_throughput.set_enabled(True)
                    async with a.open_stream(peer_id, addrs) as s:
                        assert mends_throughput._fast(muxed(s)) is here_mended
                        for n in SIZES:
                            payload = os.urandom(n)
                            await write_frame(s, payload)
                            assert bytes(await read_frame(s, LIMIT)) == payload, n
            finally:
                mends_throughput.set_enabled(True)

    run(body, deadline_s=60)
