"""A 44 MB entry on loopback: libp2p (Noise+Yamux) vs raw TCP, and a real gossip session.

    .venv/bin/python -m benchmarks.bench_transport [--mb 44] [--repeat 3] [--no-write]

Every case runs on a connection opened beforehand, and the cases alternate each repetition
(median reported), so machine load hits all of them alike. Each time runs from the first
byte written until the receiver has the whole frame (or has finished the session):

* framed bytes: one frame of ``--mb`` MB over raw trio TCP, over peerd.net.transport in this
  process (sender and receiver share a core and the GIL), and to a child process (as
  between two daemons);
* one real signed entry of ``--mb`` MB (``mb * 1e6 / 4`` float32 parameters) through
  ``peerd.net.gossip.run_session`` between two ``NodeState``s: Hello, Digest, Want, the entry,
  signature + hash + schema + norm verification and the cache merge, over in-memory
  channels (no network), over raw TCP with peerd's framing (received into memory, and
  spooled to a state directory as the daemon receives it), and over peerd.net.transport, in
  this process and between two daemons: B (its own libp2p host and ``NodeState``, the
  fleet's keys derived from a seed on its command line) runs in a child process and
  reports each session's cached entries on its stdout, which this process checks;
  plus ``verify`` + ``accept`` alone, and the raw TCP transfer of the same frame bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from benchmarks._report import machine, write_section
from peerd.core.entry import Schema
from peerd.core.validate import ValidationLimits
from peerd.net.framing import AfterPart, FramedStream, FrameSink, TrioFramedStream
from peerd.net.gossip import SessionContext, run_session
from peerd.net.transport import (
    Stream,
    Transport,
    TransportConfig,
    open_transport,
    read_frame,
    write_frame,
)
from peerd.node.state import NodeState, sign_own, verify
from peerd.protocol import messages as msg
from peerd.protocol.identity import private_key_from_seed, public_key_bytes
from peerd.protocol.manifest import Manifest

if TYPE_CHECKING:
    # trio_typing (a py-libp2p dependency) installs trio-stubs, which shadow trio's own
    # annotations for mypy and lack TaskStatus; the runtime never imports this.
    from trio_typing import TaskStatus

#: Raw TCP receive size, the same as peerd.net.framing's READ_CHUNK_LEN.
CHUNK = 1 << 20
LOOPBACK = TransportConfig(listen_host="127.0.0.1")
FLEET = bytes(range(16))
#: Rows of the benchmark model's weight matrices; columns follow from the entry size.
MODEL_ROWS = 4
#: Weights are small (the validator's default norm limit is 1e4) but not all zero.
WEIGHT_SCALE = 0.01
#: Keeps received entries fresh for the whole run (wall-clock τ_max, seconds).
TAU_MAX_S = 3600.0
#: Any one case taking longer means something hangs; fail instead of stalling.
CASE_TIMEOUT_S = 300.0

Case = Callable[[], Awaitable[None]]


async def ainterleaved(cases: dict[str, Case], repeat: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each case, alternating between them every repetition (the async
    twin of ``benchmarks._report.interleaved``, returning all samples)."""
    for case in cases.values():
        for _ in range(warmup):
            with trio.fail_after(CASE_TIMEOUT_S):
                await case()
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeat):
        for name, case in cases.items():
            t0 = time.perf_counter()
            with trio.fail_after(CASE_TIMEOUT_S):
                await case()
            samples[name].append(time.perf_counter() - t0)
    return samples


# --- framed bytes ---------------------------------------------------------------------------


async def _receive_exactly(stream: trio.SocketStream, n: int) -> bytes:
    chunks, remaining = [], n
    while remaining:
        chunk = await stream.receive_some(min(remaining, CHUNK))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


async def _tcp_pair(nursery: trio.Nursery) -> tuple[trio.SocketStream, trio.SocketStream]:
    """Both ends of one loopback TCP connection."""
    accepted: trio.MemorySendChannel[trio.SocketStream]
    accepted, incoming = trio.open_memory_channel[trio.SocketStream](1)

    async def handler(stream: trio.SocketStream) -> None:
        await accepted.send(stream)
        await trio.sleep_forever()  # keep the connection open until the benchmark ends

    listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    return client, await incoming.receive()


def _frame_case(send: Callable[[], Awaitable[None]], ack: Callable[[], Awaitable[object]]) -> Case:
    async def case() -> None:
        await send()
        assert await ack() == b"k"
    return case


async def _serve(limit: int) -> None:
    """Receiver in its own process (--serve): prints "peer_id port", serves until stdin EOF."""

    async def receiver(stream: Stream) -> None:
        while True:
            body = await read_frame(stream, limit)
            await write_frame(stream, b"k" if len(body) else b"")

    async with open_transport(Ed25519PrivateKey.generate(), receiver, LOOPBACK) as b:
        print(b.peer_id, b.port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)


async def _serve_sessions(n_params: int, seed: bytes) -> None:
    """B in its own process (--serve-session): prints "peer_id port", then one line per
    session, the number of entries it verified and cached ("error …" if the session
    raised), and serves until stdin EOF."""
    fleet = Fleet(n_params, seed, sign=False)

    async def receiver(stream: Stream) -> None:
        try:
            result = await run_session(stream, fleet.fresh_b(), fleet.ctx,
                                       peer_id=stream.peer_id, initiator=False)
        except Exception as exc:
            print("error", repr(exc), flush=True)
            raise
        print(result.received, flush=True)

    async with open_transport(fleet.key_b, receiver, LOOPBACK) as b:
        print(b.peer_id, b.port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)


async def _read_lines(stream: trio.abc.ReceiveStream,
                      lines: trio.MemorySendChannel[str]) -> None:
    """Forwards ``stream``'s lines until EOF, then closes ``lines``."""
    async with lines:
        buf = b""
        while chunk := await stream.receive_some(4096):
            *whole, buf = (buf + chunk).split(b"\n")
            for line in whole:
                await lines.send(line.decode())


async def _spawn(nursery: trio.Nursery, *args: str
                 ) -> tuple[trio.Process, trio.MemoryReceiveChannel[str], str, str]:
    """A child ``--serve…`` process: (process, its stdout lines after the first, its libp2p
    peer id, its port). Cancelling ``nursery`` kills it; closing its stdin ends it."""
    cmd = [sys.executable, "-m", "benchmarks.bench_transport", *args]
    proc: trio.Process = await nursery.start(functools.partial(
        trio.run_process, cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, check=False))
    send, lines = trio.open_memory_channel[str](100)
    assert proc.stdout is not None
    nursery.start_soon(_read_lines, proc.stdout, send)
    with trio.fail_after(CASE_TIMEOUT_S):
        peer_id, port = (await lines.receive()).split()
    return proc, lines, peer_id, port


async def _end(proc: trio.Process) -> None:
    """Closes the child's stdin and waits for it to exit cleanly."""
    assert proc.stdin is not None
    await proc.stdin.aclose()
    with trio.fail_after(30):
        assert await proc.wait() == 0, proc.returncode


async def _no_handler(stream: Stream) -> None:
    return None


# --- gossip sessions ------------------------------------------------------------------------


def _n_params(mb: float) -> int:
    """float32 parameters of a ``mb`` MB entry (the same in the parent and the child)."""
    return int(mb * 1_000_000) // 4


def _model(n_params: int, *, values: bool = True) -> dict[str, torch.Tensor]:
    """The benchmark model; with ``values=False`` only its shapes (meta tensors)."""
    g = torch.Generator().manual_seed(0)
    cols = n_params // MODEL_ROWS
    return {f"layer{i}.weight": (torch.randn(cols, generator=g) * WEIGHT_SCALE if values
                                 else torch.empty(cols, device="meta"))
            for i in range(MODEL_ROWS)}


class Fleet:
    """Two members of one fleet: A holds a signed entry, each B starts empty.

    The keys derive from ``seed``, so a child process given the same seed (and model size)
    builds the same manifest, schema and B; it skips signing A's entry (``sign=False``).
    """

    def __init__(self, n_params: int, seed: bytes, *, sign: bool = True) -> None:
        admin, self.key_a, self.key_b = (
            private_key_from_seed(hashlib.sha256(seed + role).digest())
            for role in (b"admin", b"a", b"b"))
        manifest = Manifest(FLEET, 0)
        for k in (self.key_a, self.key_b):
            manifest = manifest.admit(public_key_bytes(k), None)
        self.manifest = manifest
        params = _model(n_params, values=sign)
        self.schema = Schema.of(params)
        self.ctx = SessionContext(admin_key=public_key_bytes(admin), now=time.time)
        self.a = self.node(self.key_a)
        if sign:
            entry, self.message = sign_own(self.key_a, FLEET, params=params, version=1,
                                           created_at=time.time(), num_examples=100)
            self.a.set_own(entry, self.message)
        #: Entries each libp2p-served session cached (checked after the run).
        self.served: list[int] = []

    def node(self, key: Ed25519PrivateKey) -> NodeState:
        return NodeState(key=key, fleet_id=FLEET, manifest=self.manifest, schema=self.schema,
                         limits=ValidationLimits(), tau_max=TAU_MAX_S, capacity=10)

    def frame_parts(self) -> list[bytes | memoryview]:
        return [self.message.head(), memoryview(self.message.payload)]

    def fresh_b(self) -> NodeState:
        return self.node(self.key_b)


async def _session_pair(fleet: Fleet, io_a: FramedStream, io_b: FramedStream,
                        ctx_b: SessionContext | None = None) -> None:
    """A (initiator) and a fresh B swap over the two ends; B must cache A's entry."""
    b = fleet.fresh_b()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(run_session, io_a, fleet.a, fleet.ctx,
                                             peer_id=b.id, initiator=True))
        result = await run_session(io_b, b, ctx_b or fleet.ctx, peer_id=fleet.a.id,
                                   initiator=False)
    assert result.received == 1, result


class MemoryIO(FramedStream):
    """In-memory frames: the session without any network or framing cost."""

    def __init__(self, send: trio.MemorySendChannel[bytes],
                 recv: trio.MemoryReceiveChannel[bytes], peer_id: str) -> None:
        self._send, self._recv, self.peer_id = send, recv, peer_id

    async def read_some(self, max_bytes: int) -> bytes:
        raise NotImplementedError  # recv is overridden: frames arrive whole

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        raise NotImplementedError  # send is overridden

    async def send(self, parts: Sequence[bytes | bytearray | memoryview],
                   after_part: AfterPart | None = None) -> None:
        await self._send.send(b"".join(parts))

    async def recv(self, max_len: int, sink: FrameSink | None = None) -> memoryview:
        frame = await self._recv.receive()
        assert len(frame) <= max_len
        return memoryview(frame)


def _memory_pair() -> tuple[MemoryIO, MemoryIO]:
    a_send, b_recv = trio.open_memory_channel[bytes](100)
    b_send, a_recv = trio.open_memory_channel[bytes](100)
    return MemoryIO(a_send, a_recv, "b"), MemoryIO(b_send, b_recv, "a")


# --- main -----------------------------------------------------------------------------------

ROWS = (
    ("raw_frame", "framed bytes, raw TCP (trio)"),
    ("p2p_frame", "framed bytes, peerd.net.transport, one process"),
    ("p2p2_frame", "framed bytes, peerd.net.transport, two processes"),
    ("raw_entry", "entry frame bytes, raw TCP (trio)"),
    ("verify", "entry: `verify` + `accept` only, no I/O"),
    ("mem_session", "entry: gossip session, in-memory channels"),
    ("tcp_session", "entry: gossip session, raw TCP + peerd framing"),
    ("spool_session", "entry: the same, spooled to a state directory as the daemon does"),
    ("p2p_session", "entry: gossip session, peerd.net.transport, one process"),
    ("p2p2_session", "entry: gossip session, peerd.net.transport, two processes"),
)


async def main(mb: float, repeat: int) -> dict[str, list[float]]:
    payload = os.urandom(int(mb * 1_000_000))
    seed = os.urandom(32)
    fleet = Fleet(_n_params(mb), seed)
    entry_bytes = b"".join(fleet.frame_parts())
    limit = max(len(payload), len(entry_bytes))
    cases: dict[str, Case] = {}
    # Removed when the run ends (or by its finalizer if the run fails).
    spool_tmp = tempfile.TemporaryDirectory(prefix="peerd-bench-")
    async with trio.open_nursery() as nursery:
        # raw TCP: a frame, acknowledged by one byte
        raw_tx, raw_rx = await _tcp_pair(nursery)

        async def raw_receiver() -> None:
            while True:
                (length,) = struct.unpack(">I", await _receive_exactly(raw_rx, 4))
                await _receive_exactly(raw_rx, length)
                await raw_rx.send_all(b"k")

        async def raw_send(body: bytes) -> None:
            await raw_tx.send_all(struct.pack(">I", len(body)))
            await raw_tx.send_all(body)

        nursery.start_soon(raw_receiver)
        for name, body in (("raw_frame", payload), ("raw_entry", entry_bytes)):
            cases[name] = _frame_case(functools.partial(raw_send, body),
                                      functools.partial(raw_tx.receive_some, 1))

        # peerd.net.transport, both hosts in this process
        async def p2p_receiver(stream: Stream) -> None:
            while True:
                await read_frame(stream, limit)
                await write_frame(stream, b"k")

        b = await nursery.start(_run_host, p2p_receiver)
        a = await nursery.start(_run_host, _no_handler)
        s = await nursery.start(_open_stream, a, b.peer_id, b.listen_addrs)
        cases["p2p_frame"] = _frame_case(functools.partial(write_frame, s, payload),
                                         functools.partial(read_frame, s, 1))

        # peerd.net.transport to a child process
        proc, _, child_id, child_port = await _spawn(nursery, "--serve", "--mb", str(mb))
        s2 = await nursery.start(_open_stream, a, child_id, [f"/ip4/127.0.0.1/tcp/{child_port}"])
        cases["p2p2_frame"] = _frame_case(functools.partial(write_frame, s2, payload),
                                          functools.partial(read_frame, s2, 1))

        # gossip sessions
        async def verify_only() -> None:
            b_node = fleet.fresh_b()
            entry = msg.decode_frame(entry_bytes)
            assert isinstance(entry, msg.Entry)
            v = await trio.to_thread.run_sync(lambda: verify(
                entry, fleet_id=FLEET, manifest=fleet.manifest,
                ledger=b_node.ledger.view(), schema=fleet.schema, limits=b_node.limits,
                now=time.time()))
            assert b_node.accept(v, sender=fleet.a.id, now=time.time()) is None

        async def mem_session() -> None:
            await _session_pair(fleet, *_memory_pair())

        s_tx, s_rx = await _tcp_pair(nursery)
        tcp_a, tcp_b = TrioFramedStream(s_tx, "b"), TrioFramedStream(s_rx, "a")

        async def tcp_session() -> None:
            await _session_pair(fleet, tcp_a, tcp_b)

        spool_ctx = dataclasses.replace(fleet.ctx, spool_dir=Path(spool_tmp.name))

        async def spool_session() -> None:
            # Written to disk as it arrives, hashed and validated from the mapped file; the
            # refused-or-dropped temporary file goes with the session (nothing commits it).
            await _session_pair(fleet, tcp_a, tcp_b, spool_ctx)

        gb = await nursery.start(_run_host, functools.partial(_serve_session, fleet),
                                 fleet.key_b)
        ga = await nursery.start(_run_host, _no_handler, fleet.key_a)
        await ga.connect(gb.peer_id, gb.listen_addrs)

        async def p2p_session() -> None:
            async with ga.open_stream(gb.peer_id, gb.listen_addrs) as stream:
                result = await run_session(stream, fleet.a, fleet.ctx, peer_id=gb.peer_id,
                                           initiator=True)
                assert result.sent == 1, result
            # B's side finished verifying before it sent its (empty) entries, so the session
            # ending on A's side means the entry is verified and merged on B's side.

        # B in a child process (as between two daemons), with A on a host of its own: the
        # child's B has key_b too, and one host's connections are keyed by peer id.
        proc_b, served_b, b2_id, b2_port = await _spawn(
            nursery, "--serve-session", seed.hex(), "--mb", str(mb))
        b2_addrs = [f"/ip4/127.0.0.1/tcp/{b2_port}"]
        assert b2_id == gb.peer_id, (b2_id, gb.peer_id)
        ga2 = await nursery.start(_run_host, _no_handler, fleet.key_a)
        await ga2.connect(b2_id, b2_addrs)

        async def p2p2_session() -> None:
            async with ga2.open_stream(b2_id, b2_addrs) as stream:
                result = await run_session(stream, fleet.a, fleet.ctx, peer_id=b2_id,
                                           initiator=True)
                assert result.sent == 1, result
            # As above; the child reports what it cached on its stdout (checked below).

        cases["verify"] = verify_only
        cases["mem_session"] = mem_session
        cases["tcp_session"] = tcp_session
        cases["spool_session"] = spool_session
        cases["p2p_session"] = p2p_session
        cases["p2p2_session"] = p2p2_session
        samples = await ainterleaved({k: cases[k] for k, _ in ROWS}, repeat)
        assert fleet.served == [1] * (repeat + 1), fleet.served  # + the warm-up
        with trio.fail_after(30):  # the child prints after its side of the session returns
            served2 = [await served_b.receive() for _ in range(repeat + 1)]
        assert served2 == ["1"] * (repeat + 1), served2
        await _end(proc)
        await _end(proc_b)
        nursery.cancel_scope.cancel()
    spool_tmp.cleanup()
    return samples


async def _serve_session(fleet: Fleet, stream: Stream) -> None:
    result = await run_session(stream, fleet.fresh_b(), fleet.ctx, peer_id=stream.peer_id,
                               initiator=False)
    fleet.served.append(result.received)


async def _run_host(handler: Callable[[Stream], Awaitable[None]],
                    key: Ed25519PrivateKey | None = None, *,
                    task_status: TaskStatus[Transport] = trio.TASK_STATUS_IGNORED) -> None:
    async with open_transport(key or Ed25519PrivateKey.generate(), handler, LOOPBACK) as t:
        task_status.started(t)
        await trio.sleep_forever()


async def _open_stream(t: Transport, peer_id: str, addrs: list[str], *,
                       task_status: TaskStatus[Stream] = trio.TASK_STATUS_IGNORED) -> None:
    async with t.open_stream(peer_id, addrs) as s:
        task_status.started(s)
        await trio.sleep_forever()


def report(samples: dict[str, list[float]], mb: float, repeat: int, load: tuple[float, float],
           seconds: float) -> str:
    med = {k: statistics.median(v) for k, v in samples.items()}
    lines = [
        f"## Transport: a {mb:g} MB entry on loopback, libp2p vs raw TCP",
        "",
        f"Machine: {machine()}. Command: `.venv/bin/python -m benchmarks.bench_transport "
        f"--mb {mb:g} --repeat {repeat}` ({seconds:.0f} s; load average {load[0]:.1f} before, "
        f"{load[1]:.1f} after). Each case runs on a connection opened beforehand; the cases "
        f"alternate every repetition (1 warm-up, median of {repeat}). Times run from the first "
        "byte written until the receiver holds the whole frame (acknowledged by 1 byte) or has "
        "verified and merged the entry.",
        "",
        "| case | median s | MB/s | × raw TCP (same bytes) |",
        "| --- | --- | --- | --- |",
    ]
    for key, label in ROWS:
        base = med["raw_entry"] if key in ("verify", "mem_session", "tcp_session",
                                            "spool_session", "p2p_session", "p2p2_session",
                                            "raw_entry") else med["raw_frame"]
        lines.append(f"| {label} | {med[key]:.3f} | {mb / med[key]:.1f} | "
                     f"{med[key] / base:.1f}× |")
    net = med["p2p_session"] - med["tcp_session"]
    lines += [
        "",
        f"Where the time of one entry through a real session over libp2p goes "
        f"({med['p2p_session']:.2f} s): moving the bytes over raw TCP {med['raw_entry']:.2f} s; "
        f"verification + merge {med['verify']:.2f} s; the session over raw TCP with peerd's "
        f"framing {med['tcp_session']:.2f} s; libp2p's Noise + Yamux add {net:.2f} s on top. "
        "The one-process libp2p cases share one core and the GIL between sender and receiver; "
        "between two processes, as between two daemons, the session takes "
        f"{med['p2p2_session']:.2f} s.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=44.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print, don't touch docs/benchmarks.md")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve-session", metavar="SEED_HEX", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        trio.run(_serve, int(args.mb * 1_000_000) + CHUNK)
    elif args.serve_session:
        trio.run(_serve_sessions, _n_params(args.mb), bytes.fromhex(args.serve_session))
    else:
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        samples = trio.run(main, args.mb, args.repeat)
        text = report(samples, args.mb, args.repeat, (load0, os.getloadavg()[0]),
                      time.perf_counter() - t0)
        print(text)
        for key, _ in ROWS:
            print(key, " ".join(f"{t:.3f}" for t in samples[key]))
        if not args.no_write:
            write_section("transport", text)
