"""Where the CPU of a 44 MB entry through a two-process libp2p gossip session goes.

    .venv/bin/python -m benchmarks.profile_transport [--mb 44] [--sessions 5] [--unmended]
        [--no-profile]

The same two-process session as ``benchmarks.bench_transport``'s ``p2p2_session`` (A, the
sender, in this process; B, the receiver, a ``benchmarks.transport_peers`` child). It
reports CPU seconds per session, which machine load changes far less than wall time:

1. without a profiler: the CPU each side spent (B reports its own), and the wall time;
2. under cProfile on both sides (a second pass, skipped with ``--no-profile``): the event
   loop thread's CPU (``time.thread_time``) split by where it was spent (the categories of
   :data:`CATEGORIES`, by function ``tottime``), and calls of a few C functions. cProfile
   slows Python code more than C code, so these shares overstate the Python parts; the
   first pass gives the real totals.

``--unmended`` runs both ends with py-libp2p's own data path (``peerd.net.mends_throughput``
off), for the "before" column. Prints a markdown table; with ``--json PATH`` it also writes
the readings (per-session lists, the per-category totals, the load) and the run's provenance,
which docs/transport.md's breakdown is rendered from
(:func:`benchmarks.docs_outputs.transport_profile`).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import trio

from benchmarks import _provenance
from benchmarks import transport_peers as peers
from peerd.net import mends_throughput
from peerd.net.gossip import run_session

#: (category, test on "path:function") in order; the first match wins.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("epoll wait (idle, not CPU)", ("'poll' of 'select.epoll'",)),
    ("ChaCha20-Poly1305 (cryptography, C)", ("ChaCha20Poly1305",)),
    ("socket send/recv syscalls", ("'send' of '_socket", "'recv' of '_socket",
                                   "'recv_into' of '_socket")),
    ("Yamux (py-libp2p, Python)", ("libp2p/stream_muxer/",)),
    ("Noise, secure session, msgio (py-libp2p + noiseprotocol)",
     ("libp2p/security/", "libp2p/io/", "site-packages/noise/")),
    ("throughput mends (peerd/net/mends_throughput*.py)", ("mends_throughput",)),
    ("other py-libp2p (net stream, swarm)", ("libp2p/",)),
    ("trio scheduling, locks, events", ("trio/", "outcome/")),
    ("peerd framing + stream (peerd/net)", ("peerd/net/",)),
    ("session, verify, hash, merge (peerd, protocol, torch)",
     ("peerd/", "protocol/", "sha256", "torch", "'update' of '_hashlib")),
)
OTHER = "other (bytes copies, builtins)"
#: C functions whose call counts tell how many times a step ran (cProfile counts C calls
#: exactly; a coroutine's count would include each resumption).
COUNTED: tuple[tuple[str, str], ...] = (
    ("socket send calls", "'send' of '_socket"),
    ("socket recv calls", "'recv' of '_socket"),
    ("ChaCha20-Poly1305 encryptions (Noise messages sent)", "'encrypt' of 'cryptography"),
    ("ChaCha20-Poly1305 decryptions (Noise messages read)", "'decrypt' of 'cryptography"),
)
IDLE = CATEGORIES[0][0]


async def _sessions(mb: float, n: int, unmended: bool, profile: Path | None
                    ) -> tuple[list[float], list[float], list[float], list[float]]:
    """Wall s, A's CPU s, B's CPU s, B's event-loop thread CPU s per session (after one
    warm-up)."""
    seed = os.urandom(32)
    fleet = peers.Fleet(peers.n_params(mb), seed)
    args = ["--serve-session", seed.hex(), "--mb", str(mb), "--cpu"]
    args += ["--unmended"] if unmended else []
    args += ["--profile", str(profile / "b.prof")] if profile else []
    mends_throughput.set_enabled(not unmended)
    wall, cpu_a, cpu_b, loop_b = [], [], [], []
    async with trio.open_nursery() as nursery:
        proc, lines, b_id, b_port = await peers.spawn(nursery, *args)
        addrs = [f"/ip4/127.0.0.1/tcp/{b_port}"]
        a = await nursery.start(peers.run_host, peers.no_handler, fleet.key_a)
        await a.connect(b_id, addrs)
        # CPU time of this thread (not wall time, which load inflates; the verification
        # runs in a worker thread and is left out, as it is of B's profile)
        profiler = cProfile.Profile(time.thread_time) if profile else None
        for i in range(n + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            if profiler and i:
                profiler.enable()
            async with a.open_stream(b_id, addrs) as stream:
                result = await run_session(stream, fleet.a, fleet.ctx, peer_id=b_id,
                                           initiator=True)
            if profiler and i:
                profiler.disable()
            assert result.sent == 1, result
            with trio.fail_after(peers.CASE_TIMEOUT_S):
                received, b_cpu, b_loop = (await lines.receive()).split()
            assert received == "1", received
            if i:  # the first is the warm-up
                wall.append(time.perf_counter() - t0)
                cpu_a.append(time.process_time() - c0)
                cpu_b.append(float(b_cpu))
                loop_b.append(float(b_loop))
        if profiler and profile:
            profiler.dump_stats(profile / "a.prof")
        await peers.end(proc)
        nursery.cancel_scope.cancel()
    mends_throughput.set_enabled(True)
    return wall, cpu_a, cpu_b, loop_b


def categorize(path: Path) -> dict[str, float]:
    """tottime seconds per category, and calls of each COUNTED function, over one side's
    profile."""
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    out: dict[str, float] = {}
    for (filename, _, function), (_, calls, tottime, _, _) in stats.items():
        key = f"{filename}:{function}"
        name = next((c for c, tests in CATEGORIES if any(t in key for t in tests)), OTHER)
        out[name] = out.get(name, 0.0) + tottime
        for counted, test in COUNTED:
            if test in key:
                out[counted] = out.get(counted, 0.0) + calls
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=44.0)
    ap.add_argument("--sessions", type=int, default=5)
    ap.add_argument("--unmended", action="store_true",
                    help="py-libp2p's own data path on both ends (mends 10-14 off)")
    ap.add_argument("--no-profile", action="store_true", help="only the first pass")
    ap.add_argument("--json", type=Path, default=None, help="also write the readings here")
    args = ap.parse_args()
    started = _provenance.start(ap, args)
    load0 = os.getloadavg()[0]
    wall, cpu_a, cpu_b, loop_b = trio.run(_sessions, args.mb, args.sessions, args.unmended,
                                          None)
    med = statistics.median
    readings: dict[str, object] = {
        "mb": args.mb, "sessions": args.sessions, "unmended": args.unmended,
        "wall_s": wall, "cpu_a_s": cpu_a, "cpu_b_s": cpu_b, "loop_b_s": loop_b,
        "load_before": load0}
    if args.no_profile:
        _write(args.json, readings, started)
        print(f"{'off' if args.unmended else 'on'}: load {load0:.1f}; wall "
              f"{' '.join(f'{t:.2f}' for t in wall)}; CPU B "
              f"{' '.join(f'{t:.2f}' for t in cpu_b)} (median {med(cpu_b):.3f}), of which "
              f"its event-loop thread {' '.join(f'{t:.3f}' for t in loop_b)} (median "
              f"{med(loop_b):.3f}); CPU A median {med(cpu_a):.3f}")
        return
    with tempfile.TemporaryDirectory(prefix="peerd-profile-") as tmp:
        trio.run(_sessions, args.mb, args.sessions, args.unmended, Path(tmp))
        cats = {side: categorize(Path(tmp) / f"{side}.prof") for side in ("a", "b")}
    # Totals over the profiled sessions (a second set of n, after its own warm-up).
    readings["profiled"] = {"categories": [c for c, _ in CATEGORIES] + [OTHER],
                            "counted": [c for c, _ in COUNTED], "idle": IDLE, "totals": cats}
    _write(args.json, readings, started)
    mode = "mends 10-14 off (py-libp2p's own path)" if args.unmended else "mended"
    n = args.sessions
    print(f"{args.mb:g} MB entry, two processes, {mode}: load average {load0:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after; median of {n} sessions: wall "
          f"{med(wall):.3f} s ({args.mb / med(wall):.1f} MB/s), CPU A (sender) "
          f"{med(cpu_a):.3f} s, B (receiver) {med(cpu_b):.3f} s, of which its event-loop "
          f"thread {med(loop_b):.3f} s")
    print()
    print("| where (cProfile tottime per session) | A, sender s | B, receiver s |")
    print("| --- | ---: | ---: |")
    names = [c for c, _ in CATEGORIES] + [OTHER]
    for name in names:
        a_s, b_s = cats["a"].get(name, 0.0) / n, cats["b"].get(name, 0.0) / n
        print(f"| {name} | {a_s:.3f} | {b_s:.3f} |")
    counted = {c for c, _ in COUNTED} | {IDLE}
    busy = {side: sum(v for k, v in cats[side].items() if k not in counted) / n
            for side in cats}
    print(f"| total CPU under cProfile | {busy['a']:.3f} | {busy['b']:.3f} |")
    for name, _ in COUNTED:
        a_n, b_n = cats["a"].get(name, 0.0) / n, cats["b"].get(name, 0.0) / n
        print(f"| {name}, per session | {a_n:.0f} | {b_n:.0f} |")


def _write(path: Path | None, readings: dict[str, object], started: _provenance.Started
           ) -> None:
    if path is None:
        return
    readings["load_after"] = os.getloadavg()[0]
    readings["provenance"] = started.record()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(readings, indent=1) + "\n")


if __name__ == "__main__":
    main()
