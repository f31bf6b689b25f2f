"""A 44 MB entry on loopback: libp2p (Noise+Yamux) vs raw TCP, and a real gossip session.

    .venv/bin/python -m benchmarks.bench_transport [--mb 44] [--repeat 3] [--quick]
        [--no-write] [--render] [--cases raw_entry,tcp2_session,p2p2_session,p2p2_unmended]

The readings (every repetition's seconds, with their provenance) go to
docs/reproduction/transport.json and the section of docs/benchmarks.md is rendered from them
(``--render`` re-renders without measuring; benchmarks/docs_tables.py and tests/docs
re-render and diff it).

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
  plus ``verify`` + ``accept`` alone, and the raw TCP transfer of the same frame bytes;
* the two-process session over raw TCP too (B in a child process, peerd's framing, no
  libp2p), the baseline the libp2p case is held to, and the two-process libp2p session
  with py-libp2p's own data path (``peerd.net.mends_throughput`` off on both ends, B in a
  child of its own), so one run shows the mends' effect.

``--cases`` runs only the named cases (printed, never written to ``docs/benchmarks.md``);
``--quick`` a 4.4 MB entry, 2 repetitions.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import struct
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from benchmarks import _provenance
from benchmarks._report import readings_parser, run_section
from benchmarks.transport_peers import (
    CASE_TIMEOUT_S,
    CHUNK,
    FLEET,
    Fleet,
    end,
    n_params,
    no_handler,
    run_host,
    spawn,
)
from peerd.net import mends_throughput
from peerd.net.framing import (
    AfterPart,
    FramedStream,
    FrameSink,
    TrioFramedStream,
)
from peerd.net.gossip import SessionContext, run_session
from peerd.net.transport import (
    Stream,
    Transport,
    read_frame,
    write_frame,
)
from peerd.node.state import verify
from peerd.protocol import messages as msg

if TYPE_CHECKING:
    # trio_typing (a py-libp2p dependency) installs trio-stubs, which shadow trio's own
    # annotations for mypy and lack TaskStatus; the runtime never imports this.
    from trio_typing import TaskStatus


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


# --- gossip sessions ------------------------------------------------------------------------


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
    ("p2p_frame_unmended", "framed bytes, libp2p, one process, py-libp2p's own data path (mends 10-14 off)"),
    ("raw_entry", "entry frame bytes, raw TCP (trio)"),
    ("verify", "entry: `verify` + `accept` only, no I/O"),
    ("mem_session", "entry: gossip session, in-memory channels"),
    ("tcp_session", "entry: gossip session, raw TCP + peerd framing"),
    ("spool_session", "entry: the same, spooled to a state directory as the daemon does"),
    ("p2p_session", "entry: gossip session, peerd.net.transport, one process"),
    ("p2p2_session", "entry: gossip session, peerd.net.transport, two processes"),
    ("tcp2_session", "entry: gossip session, raw TCP + peerd framing, two processes"),
    ("p2p2_unmended", "entry: the same over libp2p, py-libp2p's own data path (mends 10-14 off)"),
)
#: Cases compared with the raw TCP entry bytes (the others with the raw TCP frame).
ENTRY_CASES = ("raw_entry", "verify", "mem_session", "tcp_session", "spool_session",
               "p2p_session", "p2p2_session", "tcp2_session", "p2p2_unmended")


async def main(mb: float, repeat: int, only: Sequence[str] = ()) -> dict[str, list[float]]:
    payload = os.urandom(int(mb * 1_000_000))
    seed = os.urandom(32)
    fleet = Fleet(n_params(mb), seed)
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

        b = await nursery.start(run_host, p2p_receiver)
        a = await nursery.start(run_host, no_handler)
        s = await nursery.start(_open_stream, a, b.peer_id, b.listen_addrs)
        cases["p2p_frame"] = _frame_case(functools.partial(write_frame, s, payload),
                                         functools.partial(read_frame, s, 1))
        # the same with mends 10-14 off on both ends (their connection is made while off)
        mends_throughput.set_enabled(False)
        try:
            ub = await nursery.start(run_host, p2p_receiver)
            ua = await nursery.start(run_host, no_handler)
            us = await nursery.start(_open_stream, ua, ub.peer_id, ub.listen_addrs)
        finally:
            mends_throughput.set_enabled(True)
        cases["p2p_frame_unmended"] = _frame_case(functools.partial(write_frame, us, payload),
                                                  functools.partial(read_frame, us, 1))

        # peerd.net.transport to a child process
        proc, _, child_id, child_port = await spawn(nursery, "--serve", "--mb", str(mb))
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

        gb = await nursery.start(run_host, functools.partial(_serve_session, fleet),
                                 fleet.key_b)
        ga = await nursery.start(run_host, no_handler, fleet.key_a)
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
        proc_b, served_b, b2_id, b2_port = await spawn(
            nursery, "--serve-session", seed.hex(), "--mb", str(mb))
        b2_addrs = [f"/ip4/127.0.0.1/tcp/{b2_port}"]
        assert b2_id == gb.peer_id, (b2_id, gb.peer_id)
        ga2 = await nursery.start(run_host, no_handler, fleet.key_a)
        await ga2.connect(b2_id, b2_addrs)

        async def p2p2_session() -> None:
            async with ga2.open_stream(b2_id, b2_addrs) as stream:
                result = await run_session(stream, fleet.a, fleet.ctx, peer_id=b2_id,
                                           initiator=True)
                assert result.sent == 1, result
            # As above; the child reports what it cached on its stdout (checked below).

        # The same between two processes over raw TCP: the baseline for the libp2p case.
        proc_t, served_t, _, t_port = await spawn(
            nursery, "--serve-tcp-session", seed.hex(), "--mb", str(mb))
        tcp2_socket = await trio.open_tcp_stream("127.0.0.1", int(t_port))
        tcp2 = TrioFramedStream(tcp2_socket, "b")

        async def tcp2_session() -> None:
            result = await run_session(tcp2, fleet.a, fleet.ctx, peer_id=gb.peer_id,
                                       initiator=True)
            assert result.sent == 1, result

        # And over libp2p with py-libp2p's own data path: mends 10-14 off on both ends
        # (a child of its own; this end's connection is made while they are off).
        proc_u, served_u, u_id, u_port = await spawn(
            nursery, "--serve-session", seed.hex(), "--mb", str(mb), "--unmended")
        u_addrs = [f"/ip4/127.0.0.1/tcp/{u_port}"]
        gu = await nursery.start(run_host, no_handler, fleet.key_a)
        mends_throughput.set_enabled(False)
        try:
            await gu.connect(u_id, u_addrs)
        finally:
            mends_throughput.set_enabled(True)

        async def p2p2_unmended() -> None:
            async with gu.open_stream(u_id, u_addrs) as stream:
                result = await run_session(stream, fleet.a, fleet.ctx, peer_id=u_id,
                                           initiator=True)
                assert result.sent == 1, result

        cases["tcp2_session"] = tcp2_session
        cases["p2p2_unmended"] = p2p2_unmended
        cases["verify"] = verify_only
        cases["mem_session"] = mem_session
        cases["tcp_session"] = tcp_session
        cases["spool_session"] = spool_session
        cases["p2p_session"] = p2p_session
        cases["p2p2_session"] = p2p2_session
        chosen = [k for k, _ in ROWS if not only or k in only]
        samples = await ainterleaved({k: cases[k] for k in chosen}, repeat)
        runs = repeat + 1  # + the warm-up
        assert fleet.served == [1] * (runs if "p2p_session" in chosen else 0), fleet.served
        for key, lines in (("p2p2_session", served_b), ("tcp2_session", served_t),
                           ("p2p2_unmended", served_u)):
            if key in chosen:
                with trio.fail_after(30):  # the child prints after its side returns
                    served2 = [await lines.receive() for _ in range(runs)]
                assert served2 == ["1"] * runs, (key, served2)
        await tcp2_socket.aclose()
        for child in (proc, proc_b, proc_t, proc_u):
            await end(child)
        nursery.cancel_scope.cancel()
    spool_tmp.cleanup()
    return samples


async def _serve_session(fleet: Fleet, stream: Stream) -> None:
    result = await run_session(stream, fleet.fresh_b(), fleet.ctx, peer_id=stream.peer_id,
                               initiator=False)
    fleet.served.append(result.received)


async def _open_stream(t: Transport, peer_id: str, addrs: list[str], *,
                       task_status: TaskStatus[Stream] = trio.TASK_STATUS_IGNORED) -> None:
    async with t.open_stream(peer_id, addrs) as s:
        task_status.started(s)
        await trio.sleep_forever()


#: The committed readings the doc's section is rendered from (docs_tables re-renders it).
READINGS = Path(__file__).resolve().parent.parent / "docs" / "reproduction" / "transport.json"


def render(r: dict[str, Any]) -> str:
    """The doc's section from one run's readings."""
    samples, mb, repeat = r["samples"], r["mb"], r["repeat"]
    med = {k: statistics.median(v) for k, v in samples.items()}
    lines = [
        f"## Transport: a {mb:g} MB entry on loopback, libp2p vs raw TCP",
        "",
        "Each case runs on a connection opened beforehand; the cases "
        f"alternate every repetition (1 warm-up, median of {repeat}). Times run from the first "
        "byte written until the receiver holds the whole frame (acknowledged by 1 byte) or has "
        "verified and merged the entry.",
        "",
        "| case | median s | MB/s | × raw TCP (same bytes) |",
        "| --- | --- | --- | --- |",
    ]
    for key, label in ROWS:
        base = med["raw_entry"] if key in ENTRY_CASES else med["raw_frame"]
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
        "",
        summary(samples, mb),
    ]
    if "provenance" in r:
        lines += ["", _provenance.line(r["provenance"])]
    return "\n".join(lines) + "\n"


def summary(samples: dict[str, list[float]], mb: float) -> str:
    """The issue-14 figure: the two-process libp2p session against raw TCP in this run."""
    med = {k: statistics.median(v) for k, v in samples.items()}
    p2p, tcp, raw = med["p2p2_session"], med["tcp2_session"], med["raw_entry"]
    text = (f"Between two processes, an entry through a gossip session over libp2p: "
            f"{mb / p2p:.1f} MB/s, {tcp / p2p:.2f}× the same session over raw TCP "
            f"({mb / tcp:.1f} MB/s) and {raw / p2p:.2f}× raw TCP moving the entry's bytes "
            f"({mb / raw:.1f} MB/s)")
    if "p2p2_unmended" in med:
        old = med["p2p2_unmended"]
        text += (f"; with py-libp2p's own data path (mends 10-14 off) {mb / old:.1f} MB/s, "
                 f"{tcp / old:.2f}× raw TCP's session")
    text += "."
    if {"p2p_frame", "p2p_frame_unmended", "raw_frame"} <= med.keys():
        new, old, raw = med["p2p_frame"], med["p2p_frame_unmended"], med["raw_frame"]
        text += (f" One frame in one process (no scheduling between processes): libp2p "
                 f"{mb / new:.1f} MB/s, {raw / new:.2f}× raw TCP ({mb / raw:.1f} MB/s); "
                 f"with mends 10-14 off {mb / old:.1f} MB/s, {raw / old:.2f}×.")
    return text


def cli() -> None:
    ap = readings_parser(__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=44.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="",
                    help="comma-separated case keys to run (printed only): "
                         + ",".join(k for k, _ in ROWS))
    args = ap.parse_args()
    only = [k for k in args.cases.split(",") if k]
    if unknown := set(only) - {k for k, _ in ROWS}:
        ap.error(f"unknown cases: {', '.join(sorted(unknown))}")
    mb, repeat = (4.4, 2) if args.quick else (args.mb, args.repeat)
    if only:
        t0 = time.perf_counter()
        samples = trio.run(main, mb, repeat, only)
        print(f"load average {os.getloadavg()[0]:.1f} after; {time.perf_counter() - t0:.0f} s")
        if {"p2p2_session", "tcp2_session", "raw_entry"} <= set(only):
            print(summary(samples, mb))
    else:
        def measure() -> dict[str, Any]:
            return {"mb": mb, "repeat": repeat, "samples": trio.run(main, mb, repeat, [])}

        run_section("transport", ap, args, READINGS, measure, render)


if __name__ == "__main__":
    cli()
