"""Where a daemon's memory over the torch baseline goes: its imports by package, then run time.

    .venv/bin/python -m benchmarks.bench_rss [--runs 3] [--out FILE]

1. **Imports** (a fresh interpreter per run): the packages `peerd run` imports, one group at
   a time in dependency order, VmRSS / RssAnon / RssFile after each. A group's figure is what
   it adds on top of the groups before it (its own modules and any dependency not loaded
   yet), so the order matters; it follows what a daemon loads: torch first, then the
   dependencies py-libp2p pulls in at import time, then libp2p's own modules, then peerd.
   The first row is the interpreter with this module's own standard-library imports
   (argparse, json, subprocess, statistics: ~4 MB, all of which a daemon imports too).
   The last step is typer parsing ``peerd run --config FILE`` (typer >= 0.2x validates
   every parameter through pydantic, imported on first use).
2. **Run time**: one `peerd run` daemon (the ``digits`` task's default model, round interval
   2 s) alone in a network namespace with mDNS on (as root; else on loopback without mDNS),
   its ``/proc/PID/status`` polled every 20 ms from launch until round 3: VmRSS when it logs
   "listening" and after round 3, its VmHWM, and where the final RSS lies
   (``/proc/PID/smaps`` by mapping: torch's libraries, other files, the main heap, glibc's
   per-thread arenas, thread stacks, other anonymous mappings), with the threads by name.

MB = 10^6 bytes. The median over ``--runs`` of each figure is reported. Run on a quiet
machine: the figures are memory, not time, but a busy machine changes how many threads
allocate at once (glibc arenas).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

MB = 1e6
#: (label, modules) in the order a daemon loads them; each adds what is not loaded yet.
IMPORT_STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch", ("torch",)),
    ("trio", ("trio",)),
    ("cryptography (Ed25519)", ("cryptography.hazmat.primitives.asymmetric.ed25519",)),
    ("zeroconf", ("zeroconf",)),
    ("typer, rich", ("typer", "rich.console")),
    ("dnspython, aioquic (via libp2p)", ("dns.resolver",)),
    ("requests (via libp2p)", ("requests",)),
    ("httpx (via libp2p)", ("httpx",)),
    ("libp2p's other dependencies", (
        "Crypto.Cipher.AES", "nacl.signing", "noise.connection", "prometheus_client",
        "fastecdsa.curve", "coincurve", "netaddr", "multiaddr", "psutil", "blake3", "cbor2",
        "sqlite3", "miniupnpc")),
    ("libp2p's own modules", ("libp2p",)),
    ("peerd (cli and daemon modules)", ("peerd.cli.app", "peerd.daemon.daemon")),
)
PARSE_STEP = "typer parsing `peerd run --config FILE` (pydantic)"
LONE_ROUNDS = 3
POLL_S = 0.02
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _status(path: str = "/proc/self/status") -> dict[str, int]:
    out: dict[str, int] = {}
    with open(path) as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
            elif key == "Threads":
                out[key] = int(value)
    return out


def child_imports() -> None:
    """In a fresh interpreter: import the steps, print one JSON line of readings."""
    import importlib

    rows = [{"step": "interpreter (and this module's stdlib imports)", **_status()}]
    for label, modules in IMPORT_STEPS:
        for name in modules:
            importlib.import_module(name)
        rows.append({"step": label, **_status()})
    # The typer app, not the console entry point: that one ends the process (os._exit,
    # peerd.cli.fastexit) where this child still has readings to print.
    from peerd.cli.app import app

    missing = Path(tempfile.gettempdir()) / f"peerd-bench-rss-{os.getpid()}-missing.toml"
    sys.argv = ["peerd", "run", "--config", str(missing)]
    with contextlib.suppress(SystemExit):
        app()  # parses the arguments, then fails to read the config: exit 2
    rows.append({"step": PARSE_STEP, **_status()})
    print(json.dumps({"rows": rows, "smaps": smaps_breakdown(os.getpid())}))


def bench_imports() -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_rss", "--child-imports"],
                         capture_output=True, text=True, check=True, timeout=300)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _mappings(pid: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    head = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$")
    with open(f"/proc/{pid}/smaps") as fh:
        for line in fh:
            m = head.match(line)
            if m:
                lo, hi = int(m[1], 16), int(m[2], 16)
                rows.append({"lo": lo, "size": hi - lo, "perms": m[3], "name": m[4].strip(),
                             "rss": 0})
            elif line.startswith("Rss:"):
                rows[-1]["rss"] = int(line.split()[1]) * 1024
    return rows


#: glibc reserves each per-thread arena as a HEAP_MAX_SIZE (64 MiB on 64-bit) aligned block.
_ARENA_ALIGN = 64 * 1024 * 1024


def smaps_breakdown(pid: int) -> dict[str, int]:
    """Resident bytes by kind of mapping (see the module docstring)."""
    rows = _mappings(pid)
    out: collections.Counter[str] = collections.Counter()
    for i, r in enumerate(rows):
        name = r["name"]
        if name == "[heap]":
            kind = "anon: main heap ([heap])"
        elif name.startswith("/"):
            kind = "file: torch libraries" if "/torch/" in name else "file: other"
        elif name:
            kind = "other (" + name + ")"
        elif r["perms"] == "rw-p" and r["lo"] % _ARENA_ALIGN == 0 and i + 1 < len(rows) \
                and rows[i + 1]["perms"] == "---p" and not rows[i + 1]["name"]:
            kind = "anon: glibc thread arenas"
        elif r["perms"] == "rw-p" and i > 0 and rows[i - 1]["perms"] == "---p" \
                and rows[i - 1]["size"] == 4096 and r["size"] >= 1 << 20:
            kind = "anon: thread stacks"
        else:
            kind = "anon: other mappings (pymalloc arenas, mmapped buffers, libraries')"
        out[kind] += r["rss"]
    return dict(out)


def threads_of(pid: int) -> dict[str, int]:
    names: collections.Counter[str] = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        names[Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()] += 1
    return dict(names)


def _log_times(log: str) -> list[tuple[float, str]]:
    out = []
    for line in log.splitlines():
        m = _LOG_TIME.match(line)
        if m:
            out.append((datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp(), line))
    return out


def bench_runtime() -> dict[str, Any]:
    from peerd.mesh import netns
    from peerd.mesh.localmesh import local_mesh

    use_netns = netns.unavailable() is None
    samples: list[tuple[float, dict[str, int]]] = []
    with tempfile.TemporaryDirectory(prefix="peerd-bench-rss-") as tmp, local_mesh(
            Path(tmp), 1, use_netns=use_netns, learning={"round_interval_s": 2.0}) as mesh:
        node = mesh[0]
        assert node.proc is not None
        pid = node.proc.pid
        t0, last_read, rounds = time.time(), 0.0, 0
        while rounds < LONE_ROUNDS:
            if time.time() - t0 > 180:
                raise RuntimeError(f"the daemon did not do {LONE_ROUNDS} rounds in 180 s")
            if not node.alive():
                raise RuntimeError(f"the daemon exited:\n{node.logs()[-3000:]}")
            samples.append((time.time(), _status(f"/proc/{pid}/status")))
            if time.time() - last_read > 0.5:
                last_read = time.time()
                status = node.poll()
                rounds = 0 if status is None else status.node.round
            time.sleep(POLL_S)  # polling another process: nothing to wait on
        final = _status(f"/proc/{pid}/status")
        smaps = smaps_breakdown(pid)
        threads = threads_of(pid)
        log = node.log.read_text()
    events = _log_times(log)
    listening = next((t for t, line in events if " listening on " in line), None)
    first_round = next((t for t, line in events if "round 1:" in line), None)

    def rss_at(when: float | None) -> int | None:
        if when is None:
            return None
        before = [s for t, s in samples if t <= when]
        return before[-1]["VmRSS"] if before else None

    return {"netns": use_netns, "final": final, "smaps": smaps, "threads": threads,
            "rss_listening": rss_at(listening), "rss_before_round1": rss_at(first_round),
            "seconds_to_listening": None if listening is None else listening - t0}


def report(runs: list[dict[str, Any]]) -> str:
    imports = [r["imports"] for r in runs]
    steps = [row["step"] for row in imports[0]["rows"]]
    lines = ["### Imports of `peerd run`, one group at a time (fresh interpreter)", "",
             "| step | VmRSS after | adds | of which anonymous / file |",
             "| --- | --- | --- | --- |"]
    for i, step in enumerate(steps):
        rss = statistics.median([imp["rows"][i]["VmRSS"] for imp in imports])
        if i == 0:
            lines.append(f"| {step} | {rss / MB:.1f} MB | | |")
            continue
        add = statistics.median([imp["rows"][i]["VmRSS"] - imp["rows"][i - 1]["VmRSS"]
                       for imp in imports])
        anon = statistics.median([imp["rows"][i]["RssAnon"] - imp["rows"][i - 1]["RssAnon"]
                        for imp in imports])
        file = statistics.median([imp["rows"][i]["RssFile"] - imp["rows"][i - 1]["RssFile"]
                        for imp in imports])
        lines.append(f"| {step} | {rss / MB:.1f} MB | +{add / MB:.1f} MB | "
                     f"+{anon / MB:.1f} / +{file / MB:.1f} MB |")
    base = statistics.median([r["torch_baseline"] for r in runs])
    rt = [r["runtime"] for r in runs]
    last_import = statistics.median([imp["rows"][-1]["VmRSS"] for imp in imports])
    listen = [x["rss_listening"] for x in rt if x["rss_listening"] is not None]
    final = statistics.median([x["final"]["VmRSS"] for x in rt])
    hwm = statistics.median([x["final"]["VmHWM"] for x in rt])
    lines += ["", "### Run time: one lone daemon (digits task, default model)", "",
              "| reading | value |", "| --- | --- |",
              f"| torch baseline: VmHWM of `python -c \"import torch\"` | {base / MB:.1f} MB |",
              f"| all imports + argument parsing (above) | {last_import / MB:.1f} MB |"]
    if listen:
        lines.append(f"| daemon built, host listening, mDNS up: VmRSS | "
                     f"{statistics.median(listen) / MB:.1f} MB |")
    lines += [f"| after {LONE_ROUNDS} rounds: VmRSS / VmHWM | {final / MB:.1f} / "
              f"{hwm / MB:.1f} MB |",
              f"| VmHWM over the torch baseline | {(hwm - base) / MB:.1f} MB |",
              "", "| where the final RSS lies (smaps) | imports only | running daemon | "
              "difference |", "| --- | --- | --- | --- |"]
    kinds = sorted({k for r in runs for k in (*r["runtime"]["smaps"], *r["imports"]["smaps"])})
    for kind in kinds:
        a = statistics.median([imp["smaps"].get(kind, 0) for imp in imports])
        b = statistics.median([x["smaps"].get(kind, 0) for x in rt])
        if max(a, b) < 0.05 * MB:
            continue  # [vdso], [vvar]: kernel pages, nothing to say
        lines.append(f"| {kind} | {a / MB:.1f} MB | {b / MB:.1f} MB | {(b - a) / MB:+.1f} MB |")
    lines += ["", f"Threads of the running daemon: {rt[-1]['threads']}."]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="also write the readings as JSON")
    p.add_argument("--write", action="store_true",
                   help="write the tables into docs/benchmarks.md (section 'rss')")
    p.add_argument("--child-imports", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child_imports:
        child_imports()
        return
    # Not at the top: the import readings start from an interpreter without torch.
    from benchmarks import _provenance
    from benchmarks.bench_daemon import torch_baseline

    started = _provenance.start(p, args)
    runs = [{"torch_baseline": torch_baseline(), "imports": bench_imports(),
             "runtime": bench_runtime()} for _ in range(args.runs)]
    record = started.record()  # after the readings: it imports torch
    if args.out is not None:
        args.out.write_text(json.dumps({"runs": runs, "env": {
            k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
            "provenance": record}, indent=1) + "\n")
    text = report(runs)
    if args.write:
        from benchmarks._report import machine, write_section

        load = os.getloadavg()[0]
        command = " ".join(["python -m benchmarks.bench_rss", *sys.argv[1:]])
        text = (f"## Daemon memory: where a lone daemon's RSS over the torch baseline goes\n\n"
                f"Machine: {machine()}. Command: `.venv/bin/{command}` (as root for the "
                f"namespace; load average {load:.1f} at the end). Medians of {args.runs} "
                f"runs; MB = 10^6 bytes.\n\n{text}\n\n{_provenance.line(record)}")
        write_section("rss", text)
    print(text)


if __name__ == "__main__":
    main()
