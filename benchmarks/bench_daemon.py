"""Real `peerd run` daemons: peak memory idle and during an exchange, and start-up times.

    .venv/bin/python -m benchmarks.bench_daemon [--params 11000000] [--capacity 2]
        [--memory-runs 3] [--start-runs 5] [--compare REV] [--skip-rss] [--skip-start]
        [--quick] [--no-write] [--render]

The memory readings (with their provenance) go to docs/reproduction/daemon.json and the
``daemon`` section of docs/benchmarks.md is rendered from them; the start-up readings go to
docs/reproduction/daemon-start.json and its ``daemon-start`` section (``--render``
re-renders both without measuring; benchmarks/docs_tables.py and tests/docs diff them).

1. **Memory** (loopback, mDNS off): a daemon M whose task's model has ``--params`` float32
   parameters (44 MB at the default; an MLP of 10 hidden layers ~1044 wide) runs alone until it has trained and published a few
   rounds (idle), then ``--capacity`` (C) peers of the same fleet start and dial it; once M
   caches all C of their entries and has blended them for a few rounds, its
   ``/proc/PID/status`` VmHWM (peak RSS since start) and VmRSS are read again. Compared
   with the issue's goal, torch baseline + (C+3) × model size, where the torch baseline is
   the peak RSS of ``python -c "import torch"``. A daemon with a tiny model, idle, gives
   the fixed cost of the daemon's code (libp2p, zeroconf, cryptography, ...).
   Then the daemon's own steps (build, round, receive, persist) run one at a time in one
   process to show which of them allocate how many model sizes (:mod:`benchmarks._breakdown`).
2. **Start-up** (:mod:`benchmarks._startup`): launch → READY=1 of one node, and launch →
   first entry in fresh two-namespace meshes (mDNS on; needs root and iproute2; mDNS never
   leaves the namespaces), ``--start-runs`` times, each next to ``python -c "import
   torch"``; with ``--compare REV`` also the daemon of that revision. (It replaced an older
   mesh phase that timed log lines of two meshes once, without a baseline: the two
   sections then disagreed about the time to the first entry.)

Daemons are always stopped (SIGTERM, then SIGKILL) and namespaces deleted, also on errors.
The daemons load their task from this module (``benchmarks.bench_daemon:bench_task``), so
it imports only what a daemon imports anyway.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks import _provenance
from benchmarks._daemons import REPO, Daemon, make_fleet, running, wait_for, write_config
from benchmarks._startup import START_JSON, bench_start, save_start, start_report
from peerd.learn.models import MLP
from peerd.learn.tasks import FLEET_INIT_SEED, TaskData

#: The daemon's task size, passed to :func:`bench_task` in the daemon's environment.
PARAMS_ENV = "PEERD_BENCH_PARAMS"
#: The benchmark task's input width and classes (digits-like synthetic data).
FEATURES, CLASSES = 64, 10
#: Models this large are a deep MLP (an architecture someone would train): 10 square hidden
#: layers, ~1044 wide at 11M parameters. A single hidden layer 146k units wide, used before,
#: made one weight 85% of the model and activations of a batch a third of it.
DEEP_MIN_PARAMS = 1_000_000
DEEP_LAYERS = 10
TRAIN_ROWS, VAL_ROWS = 256, 64
#: Parameters of the tiny model that measures the daemon's fixed memory cost.
TINY_PARAMS = 10_000
#: Start-up imports torch, libp2p, zeroconf on a shared 2-core machine: be generous.
START_TIMEOUT_S = 120.0
#: C entries of 44 MB over libp2p (~15 MB/s when loaded) plus verification and rounds.
EXCHANGE_TIMEOUT_S = 240.0
#: Rounds M must have completed (training and publishing) before the idle reading, and
#: after caching all C entries (each of those rounds blends them) before the final one.
SETTLE_ROUNDS = 2
#: Memory-phase learning settings: short rounds (the point is memory, not accuracy), a
#: τ_max that keeps every entry for the whole run.
MEMORY_LEARNING = {"round_interval_s": 2.0, "local_steps": 2, "batch_size": 32,
                   "tau_max": 3600.0}
MB = 1e6


# --- the benchmark task (runs inside the daemons) -------------------------------------------


@dataclass
class BenchTask:
    """A one-hidden-layer MLP sized to ``params`` parameters, on fixed synthetic data."""

    params: int
    name: str = "bench"
    loss: str = "cross_entropy"
    _data: TaskData | None = field(default=None, repr=False)

    def model(self) -> torch.nn.Module:
        torch.manual_seed(FLEET_INIT_SEED)  # the same start on every node
        if self.params < DEEP_MIN_PARAMS:
            # 64·H + H + 10·H + 10 parameters: the tiny model of the fixed-cost reading.
            hidden = max(1, (self.params - CLASSES) // (FEATURES + 1 + CLASSES))
            return MLP(FEATURES, CLASSES, hidden=hidden)
        # DEEP_LAYERS square layers of width W plus input and output layers:
        # L·(W² + W) + (64 + 1)·W + (W + 1)·10 = params, solved for W.
        a, b, c = DEEP_LAYERS, DEEP_LAYERS + FEATURES + 1 + CLASSES, CLASSES - self.params
        width = int((-b + (b * b - 4 * a * c) ** 0.5) / (2 * a))
        layers: list[torch.nn.Module] = [torch.nn.Linear(FEATURES, width), torch.nn.ReLU()]
        for _ in range(DEEP_LAYERS):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        layers.append(torch.nn.Linear(width, CLASSES))
        return torch.nn.Sequential(*layers)

    def data(self) -> TaskData:
        if self._data is None:
            g = torch.Generator().manual_seed(1)
            X = torch.randn(TRAIN_ROWS + VAL_ROWS, FEATURES, generator=g)
            y = torch.randint(0, CLASSES, (TRAIN_ROWS + VAL_ROWS,), generator=g)
            self._data = TaskData(X[:TRAIN_ROWS], y[:TRAIN_ROWS], X[TRAIN_ROWS:], y[TRAIN_ROWS:])
        return self._data


def bench_task() -> BenchTask:
    """``[task] name = "benchmarks.bench_daemon:bench_task"``; size from ``PARAMS_ENV``."""
    return BenchTask(int(os.environ.get(PARAMS_ENV, "11000000")))


def model_bytes(params: int) -> int:
    return sum(p.numel() * p.element_size() for p in BenchTask(params).model().parameters())


def _round(d: Daemon) -> int:
    s = d.status()
    return int(s["node"]["round"]) if s else -1


def _cached(d: Daemon) -> int:
    s = d.status()
    return len(s["cache"]) if s else 0


# --- 1. memory ------------------------------------------------------------------------------


def torch_baseline() -> int:
    """Peak RSS (bytes) of a bare ``python -c "import torch"``."""
    code = ("import torch, pathlib; print(next(l for l in pathlib.Path('/proc/self/status')"
            ".read_text().splitlines() if l.startswith('VmHWM')).split()[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=START_TIMEOUT_S).stdout
    return int(out) * 1024


def bench_memory(params: int, capacity: int) -> dict[str, Any]:
    res: dict[str, Any] = {"params": params, "capacity": capacity,
                           "model_bytes": model_bytes(params),
                           "torch_baseline": torch_baseline()}
    task = {"name": "benchmarks.bench_daemon:bench_task", "node_count": capacity + 1}
    learning = {**MEMORY_LEARNING, "capacity": capacity}
    with tempfile.TemporaryDirectory(prefix="peerd-bench-") as tmp:
        root = Path(tmp)
        m, *peers = make_fleet(root / "fleet", capacity + 1)
        (tiny,) = make_fleet(root / "tiny", 1)
        write_config(m, static=[], mdns=False, learning=learning, task=task)
        for p in peers:
            write_config(p, static=[m], mdns=False, learning=learning, task=task)
        write_config(tiny, static=[], mdns=False, learning=learning, task=task)
        with running([m, tiny, *peers]):
            t0 = time.monotonic()
            m.start({PARAMS_ENV: str(params)})
            tiny.start({PARAMS_ENV: str(TINY_PARAMS)})
            wait_for(lambda: _round(m) >= SETTLE_ROUNDS and _round(tiny) >= SETTLE_ROUNDS,
                     START_TIMEOUT_S, "M and the tiny daemon to run a few rounds", [m, tiny])
            res["idle"] = m.proc_status()
            res["tiny_idle"] = tiny.proc_status()
            tiny.stop()
            peak_rss = [res["idle"]["VmRSS"]]
            samples = [res["idle"]]
            t_peers = time.monotonic()
            for p in peers:
                p.start({PARAMS_ENV: str(params)})

            def sample() -> None:
                samples.append(m.proc_status())
                peak_rss.append(samples[-1]["VmRSS"])

            wait_for(lambda: _cached(m) >= capacity, START_TIMEOUT_S + EXCHANGE_TIMEOUT_S,
                     f"M to cache {capacity} entries", [m, *peers], every=sample)
            res["exchange_s"] = time.monotonic() - t_peers
            settled = _round(m) + SETTLE_ROUNDS
            wait_for(lambda: _round(m) >= settled, EXCHANGE_TIMEOUT_S,
                     "M to blend the entries for a few rounds", [m, *peers], every=sample)
            res["exchange"] = m.proc_status()
            res["peak_rss_sampled"] = max(peak_rss)
            res["peak_sample"] = max(samples, key=lambda v: v["VmRSS"])
            res["cache"] = _cached(m)
            res["seconds"] = time.monotonic() - t0
    return res


def memory_report(r: dict[str, Any]) -> list[str]:
    size, base, c = r["model_bytes"], r["torch_baseline"], r["capacity"]
    goal = base + (c + 3) * size
    hwm = r["exchange"]["VmHWM"]
    over = hwm - goal
    tiny_fixed = r["tiny_idle"]["VmHWM"] - base
    peak = r["peak_sample"]
    peaks = r.get("all_peaks", [hwm])

    def row(name: str, value: int) -> str:
        return (f"| {name} | {value / MB:.0f} MB | {(value - base) / size:+.1f} × model "
                f"over the torch baseline |")

    verdict = ("meets the goal" if over <= 0 else
               f"misses the goal by {over / MB:.0f} MB ({over / size:.1f} × model size)")
    return [
        f"### Peak memory of one daemon: {r['params'] / 1e6:.1f}M-parameter model "
        f"({size / MB:.1f} MB), C = {c}",
        "",
        "| reading | value | relative |",
        "| --- | --- | --- |",
        f"| torch baseline: peak RSS of `python -c \"import torch\"` | {base / MB:.0f} MB | |",
        row("daemon with a 10k-parameter model, idle: VmHWM", r["tiny_idle"]["VmHWM"]),
        row("idle (trained and published 2+ rounds, no peers): VmRSS", r["idle"]["VmRSS"]),
        row("idle: VmHWM", r["idle"]["VmHWM"]),
        row(f"after receiving {r['cache']} entries from C = {c} peers and blending them "
            f"for 2+ rounds: VmRSS", r["exchange"]["VmRSS"]),
        row("highest VmRSS sampled during the exchange (every 0.25 s)", r["peak_rss_sampled"]),
        f"| of which anonymous / file-backed (RssAnon / RssFile at that sample; the tiny "
        f"daemon: {r['tiny_idle']['RssAnon'] / MB:.0f} / {r['tiny_idle']['RssFile'] / MB:.0f} "
        f"MB) | {peak['RssAnon'] / MB:.0f} / {peak['RssFile'] / MB:.0f} MB | |",
        row("during exchange: VmHWM (peak since start)", hwm),
        f"| VmHWM of each of the {len(peaks)} memory runs (the highest is reported here) | "
        f"{', '.join(f'{p / MB:.0f}' for p in peaks)} MB | |",
        f"| goal: torch baseline + (C+3) × model size | {goal / MB:.0f} MB | "
        f"{c + 3:+.1f} × model |",
        "",
        f"Verdict: peak RSS {hwm / MB:.0f} MB {verdict}. The daemon's code alone (libp2p, "
        f"zeroconf, trio, cryptography, its threads) costs {tiny_fixed / MB:.0f} MB over the "
        f"torch baseline (the tiny-model daemon), which the goal does not budget for; the "
        f"rest, {(hwm - base - tiny_fixed) / size:.1f} × model size, is the model and "
        f"transients. Resident by design: the model only. The own entry, the C cached "
        f"entries and x̄ while a round trains live in state files (`peerd.store.spool`: received "
        f"frames are written to disk as they arrive, the own entry is signed into its file, "
        f"x̄ is spilled to an unlinked file), mapped read-only and read a tensor or a 4 MiB "
        f"piece at a time, each handed back to the kernel once read. Their bytes sit in the "
        f"page cache, which is not this process's RSS and which the kernel reclaims under "
        f"pressure (written-back file pages). "
        f"C = {c} peers delivered their entries to M in {r['exchange_s']:.0f} s from their "
        f"start (start-up, connection, transfer, verification). Memory phase took "
        f"{r['seconds']:.0f} s.",
    ]


#: The committed memory readings the ``daemon`` section is rendered from.
READINGS = REPO / "docs" / "reproduction" / "daemon.json"


def render(r: dict[str, Any]) -> str:
    """The ``daemon`` section from one run's memory readings."""
    from benchmarks._breakdown import breakdown_report  # imports this module's settings

    lines = [
        "## Daemon: memory",
        "",
        "Real `peerd run` processes, 1 torch thread each. Start-up and the time to the first "
        "peer's entry are the section \"Daemon: start-up\" below (`daemon-start`), measured "
        "against `import torch` in the same run.",
        "",
        *memory_report(r["memory"]), "",
        *breakdown_report(r["breakdown"]),
    ]
    if "provenance" in r:
        lines += ["", _provenance.line(r["provenance"])]
    return "\n".join(lines) + "\n"


def _render_start(start: dict[str, Any]) -> str:
    return "\n".join([
        "## Daemon: start-up",
        "",
        f"Machine: {_machine()}. Command: `{start['provenance']['command_line']}` (as root for "
        f"the namespaces). Every reading: `{START_JSON.relative_to(REPO)}`.",
        "",
        *start_report(start)])


def main() -> None:
    from benchmarks._report import readings_parser, write_section  # `python -m` from the root

    ap = readings_parser(__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=11_000_000)
    ap.add_argument("--capacity", type=int, default=2)
    ap.add_argument("--skip-rss", action="store_true")
    ap.add_argument("--skip-start", action="store_true")
    ap.add_argument("--start-runs", type=int, default=5,
                    help="rounds of the start-up timings (READY=1, first entry; medians)")
    ap.add_argument("--compare", metavar="REV",
                    help="also time the daemon of this git revision, interleaved")
    ap.add_argument("--memory-runs", type=int, default=3,
                    help="memory phases to run; the report shows the one with the highest peak")
    ap.add_argument("--breakdown-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.breakdown_child:
        import logging

        from benchmarks._breakdown import breakdown_child

        logging.disable(logging.INFO)  # stdout carries the JSON result only
        print(json.dumps(breakdown_child(args.params, args.capacity)))
        return
    if args.render:
        write_section("daemon", render(json.loads(READINGS.read_text())))
        return
    params = 1_100_000 if args.quick else args.params
    memory_runs = 1 if args.quick else args.memory_runs
    provenance = _provenance.start(ap, args)
    mem = None
    if not args.skip_rss:
        runs = [bench_memory(params, args.capacity) for _ in range(memory_runs)]
        # The worst run is the one reported and judged: a goal met only on average is not met.
        mem = max(runs, key=lambda r: r["exchange"]["VmHWM"])
        mem["all_peaks"] = [r["exchange"]["VmHWM"] for r in runs]
    # Imported here: benchmarks._breakdown imports this module's settings.
    from benchmarks._breakdown import bench_breakdown

    parts = None if args.skip_rss else bench_breakdown(params, args.capacity)
    start = None if args.skip_start else bench_start(args.start_runs, args.compare)
    record = provenance.record()
    readings = None if mem is None else {"memory": mem, "breakdown": parts,
                                         "provenance": record}
    if readings is not None:
        print(render(readings))
    if start is not None:
        start["provenance"] = record
        print(_render_start(start))
    if not args.no_write:
        if readings is not None:
            READINGS.write_text(json.dumps(readings, indent=1) + "\n")
            write_section("daemon", render(readings))
        if start is not None:
            # Its own section: start-up can be re-measured (--skip-rss) without replacing
            # the memory rows above it.
            write_section("daemon-start", _render_start(start))
            save_start(start)


def _machine() -> str:
    from benchmarks._report import machine

    return machine()


if __name__ == "__main__":
    main()
