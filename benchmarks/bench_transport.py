"""Throughput of one 44 MB frame on loopback: peerd.transport (libp2p Noise+Yamux) vs raw TCP.

    .venv/bin/python benchmarks/bench_transport.py [--mb 44] [--repeat 3]

Raw TCP and the first libp2p run have sender and receiver in this one trio process (they
share a core); the second libp2p run puts the receiver in a child process, as between two
daemons. Time runs from the first byte written until the receiver's 1-byte acknowledgement
of the whole frame.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import struct
import subprocess
import sys
import time

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.transport import Stream, TransportConfig, open_transport, read_frame, write_frame

CHUNK = 1 << 20


async def bench_libp2p(payload: bytes, repeat: int) -> list[float]:
    limit = len(payload)

    async def receiver(stream: Stream) -> None:
        for _ in range(repeat):
            body = await read_frame(stream, limit)
            assert len(body) == limit
            await write_frame(stream, b"k")

    cfg = TransportConfig(listen_host="127.0.0.1")
    times: list[float] = []
    async with (
        open_transport(Ed25519PrivateKey.generate(), receiver, cfg) as b,
        open_transport(Ed25519PrivateKey.generate(), receiver, cfg) as a,
        a.open_stream(b.peer_id, b.listen_addrs) as s,
    ):
        for _ in range(repeat):
            t0 = time.perf_counter()
            await write_frame(s, payload)
            assert await read_frame(s, 1) == b"k"
            times.append(time.perf_counter() - t0)
    return times


async def _serve(limit: int) -> None:
    """Receiver in its own process (--serve): prints "peer_id port", serves until stdin EOF."""

    async def receiver(stream: Stream) -> None:
        while True:
            body = await read_frame(stream, limit)
            await write_frame(stream, b"k" if len(body) else b"")

    cfg = TransportConfig(listen_host="127.0.0.1")
    async with open_transport(Ed25519PrivateKey.generate(), receiver, cfg) as b:
        print(b.peer_id, b.port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)


async def bench_libp2p_two_processes(payload: bytes, repeat: int) -> list[float]:
    cmd = [sys.executable, __file__, "--serve", "--mb", str(len(payload) / 1e6)]
    times: list[float] = []
    async with trio.open_nursery() as nursery:
        proc = await nursery.start(
            functools.partial(trio.run_process, cmd, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, check=False)
        )
        line = b""
        while not line.endswith(b"\n"):
            line += await proc.stdout.receive_some(200)
        peer_id, port = line.decode().split()
        cfg = TransportConfig(listen_host="127.0.0.1")
        async with (
            open_transport(Ed25519PrivateKey.generate(), _no_handler, cfg) as a,
            a.open_stream(peer_id, [f"/ip4/127.0.0.1/tcp/{port}"]) as s,
        ):
            for _ in range(repeat):
                t0 = time.perf_counter()
                await write_frame(s, payload)
                assert await read_frame(s, 1) == b"k"
                times.append(time.perf_counter() - t0)
        await proc.stdin.aclose()
    return times


async def _no_handler(stream: Stream) -> None:
    return None


async def _receive_exactly(stream: trio.SocketStream, n: int) -> bytes:
    chunks, remaining = [], n
    while remaining:
        chunk = await stream.receive_some(min(remaining, CHUNK))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


async def bench_raw_tcp(payload: bytes, repeat: int) -> list[float]:
    async def receiver(stream: trio.SocketStream) -> None:
        for _ in range(repeat):
            (length,) = struct.unpack(">I", await _receive_exactly(stream, 4))
            await _receive_exactly(stream, length)
            await stream.send_all(b"k")

    times: list[float] = []
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, receiver, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            for _ in range(repeat):
                t0 = time.perf_counter()
                await stream.send_all(struct.pack(">I", len(payload)))
                await stream.send_all(payload)
                assert await stream.receive_some(1) == b"k"
                times.append(time.perf_counter() - t0)
        nursery.cancel_scope.cancel()
    return times


async def main(mb: float, repeat: int) -> None:
    payload = os.urandom(int(mb * 1_000_000))
    size = len(payload) / 1e6
    raw = await bench_raw_tcp(payload, repeat)
    p2p = await bench_libp2p(payload, repeat)
    p2p2 = await bench_libp2p_two_processes(payload, repeat)
    for name, ts in (
        ("raw TCP (trio sockets)", raw),
        ("libp2p, one process", p2p),
        ("libp2p, two processes", p2p2),
    ):
        best, med = min(ts), statistics.median(ts)
        print(f"{name:24s} {size:.0f} MB: best {best:.3f} s ({size / best:7.1f} MB/s), "
              f"median {med:.3f} s ({size / med:7.1f} MB/s)")
    for name, ts in (("one process", p2p), ("two processes", p2p2)):
        ratio = statistics.median(ts) / statistics.median(raw)
        print(f"libp2p ({name}) / raw TCP time ratio (median): {ratio:.1f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=44.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        trio.run(_serve, int(args.mb * 1_000_000))
    else:
        trio.run(main, args.mb, args.repeat)
