"""How fast a real `peerd run` is up (issue 14): launch → READY=1, and launch → first entry
received in a two-namespace mesh, each next to ``python -c "import torch"`` timed in the
same run (the machine is shared: the ratio is the figure that travels).

``READY=1`` is timestamped where systemd would see it: each daemon gets a ``$NOTIFY_SOCKET``
datagram socket this process binds (a path: it reaches into the namespaces too). With
``compare`` (a git revision), the same runs are made, interleaved, with the daemon of that
revision (``git archive`` into a temporary folder, run from there), so before and after are
measured under the same load. Used by :mod:`benchmarks.bench_daemon`; nothing here is
imported by peerd.
"""

from __future__ import annotations

import io
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks._daemons import REPO, make_fleet, running, wait_for, write_config

#: Start-up on a loaded 2-core machine: generous; a daemon that misses it fails the run.
START_TIMEOUT_S = 120.0
MESH_TIMEOUT_S = 120.0
#: Learning settings of the start-up runs: the first round right after start-up.
LEARNING = {"round_interval_s": 2.0, "tau_max": 600.0}
#: Each recv waits this long, so a daemon that died is noticed between datagrams.
RECV_S = 0.1
#: Every reading of the last run that wrote docs/benchmarks.md.
START_JSON = REPO / "docs" / "reproduction" / "daemon-start.json"


@contextmanager
def exported(rev: str) -> Iterator[Path]:
    """The tree of git revision ``rev`` in a temporary folder, laid out as the installed
    package maps it (``peerd.protocol`` is ``protocol/``, ``peerd.cli`` is ``cli/``)."""
    with tempfile.TemporaryDirectory(prefix="peerd-rev-") as tmp:
        root = Path(tmp)
        archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=REPO,
                                 capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(root, filter="data")
        for name in ("protocol", "cli"):
            (root / "peerd" / name).symlink_to(root / name, target_is_directory=True)
        yield root


def torch_import_s() -> tuple[float, float]:
    """Wall and CPU seconds of ``python -c "import torch"`` (interpreter start included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, timeout=START_TIMEOUT_S)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a running process has used so far: unlike
    wall time, barely moved by other jobs on the machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def notify_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(RECV_S)
    return sock


def ready_seen(sock: socket.socket) -> float | None:
    """time.time() of a READY=1 waiting on ``sock``, else None (other messages are read)."""
    while True:
        try:
            message = sock.recv(4096)
        except TimeoutError:
            return None
        if message == b"READY=1":
            return time.time()


def _ready_once(root: Path, source: Path) -> tuple[float, float]:
    """One fresh node on loopback (mDNS off, task digits): wall seconds from launch to
    READY=1, and the CPU seconds it had used when READY=1 was read."""
    (node,) = make_fleet(root, 1, source=source)
    write_config(node, static=[], mdns=False, learning=LEARNING, task={"name": "digits"})
    with running([node]), notify_socket(root / "notify") as sock:
        node.start({"NOTIFY_SOCKET": str(root / "notify")})
        seen: list[tuple[float, float]] = []

        def ready() -> bool:
            at = ready_seen(sock)
            if at is not None and node.proc is not None:
                seen.append((at - node.started_at, cpu_s(node.proc.pid)))
            return bool(seen)

        wait_for(ready, START_TIMEOUT_S, "READY=1", [node])
        return seen[0]


def _mesh_once(root: Path, source: Path) -> list[dict[str, float | None]]:
    """Two daemons in two namespaces (mDNS on, task digits), started at the same instant:
    per daemon, seconds from launch to READY=1, to "listening", to the first "discovered"
    and to the first "received N entries"."""
    from tests.net.netns import netns_lan

    with ExitStack() as stack:
        hosts = stack.enter_context(netns_lan(2))
        nodes = make_fleet(root, 2, hosts=hosts, source=source)
        socks = []
        for i, d in enumerate(nodes):
            write_config(d, static=[], mdns=True, learning=LEARNING,
                         task={"name": "digits", "node_index": i, "node_count": 2})
            socks.append(stack.enter_context(notify_socket(root / f"notify{i}")))
        stack.enter_context(running(nodes))
        for i, d in enumerate(nodes):
            d.start({"NOTIFY_SOCKET": str(root / f"notify{i}")})
        ready: dict[int, float] = {}

        def done() -> bool:
            for i, sock in enumerate(socks):
                at = ready_seen(sock)
                if at is not None and i not in ready:
                    ready[i] = at - nodes[i].started_at
            return len(ready) == len(nodes) and all(
                any(e.startswith("received ") for _, e in d.events()) for d in nodes)

        wait_for(done, MESH_TIMEOUT_S, "both daemons to receive an entry", nodes)
        out = []
        for i, d in enumerate(nodes):
            events = d.events()

            def first(prefix: str, ev: list[tuple[float, str]] = events) -> float | None:
                return next((t for t, e in ev if e.startswith(prefix)), None)

            out.append({"ready": ready[i], "listening": first("listening on"),
                        "discovered": first("discovered "), "received": first("received ")})
        return out


def bench_start(runs: int, compare: str | None = None) -> dict[str, Any]:
    """``runs`` rounds, each: ``import torch``, then READY=1 of a fresh node and a fresh
    two-namespace mesh with this checkout (and with ``compare``'s daemon, interleaved)."""
    from tests.net.netns import skip_reason

    load0 = os.getloadavg()
    mesh_skipped = skip_reason()
    sources = {"now": REPO}
    with ExitStack() as stack:
        if compare is not None:
            sources[compare] = stack.enter_context(exported(compare))
        res: dict[str, Any] = {"runs": runs, "compare": compare, "torch_import": [],
                               "torch_cpu": [], "ready_cpu": {k: [] for k in sources},
                               "ready": {k: [] for k in sources},
                               "mesh": {k: [] for k in sources}, "mesh_skipped": mesh_skipped}
        for i in range(runs):
            wall, cpu = torch_import_s()
            res["torch_import"].append(wall)
            res["torch_cpu"].append(cpu)
            # Alternate which tree goes first: a load that rises or falls hits both alike.
            order = list(sources.items())[::-1 if i % 2 else 1]
            for name, source in order:
                with tempfile.TemporaryDirectory(prefix="peerd-start-") as tmp:
                    wall, cpu = _ready_once(Path(tmp), source)
                    res["ready"][name].append(wall)
                    res["ready_cpu"][name].append(cpu)
                if mesh_skipped is None:
                    with tempfile.TemporaryDirectory(prefix="peerd-start-") as tmp:
                        res["mesh"][name].append(_mesh_once(Path(tmp), source))
    res["load"] = (load0, os.getloadavg())
    return res


def _spread(values: list[float]) -> str:
    return (f"{statistics.median(values):.2f} s ({min(values):.2f}–{max(values):.2f}, "
            f"n = {len(values)})")


def start_report(r: dict[str, Any]) -> list[str]:
    base = statistics.median(r["torch_import"])
    load0, load1 = r["load"]
    names = list(r["ready"])
    lines = [
        "### Start-up: launch to READY=1, and to the first entry",
        "",
        f"{r['runs']} rounds, one after another; each round times `python -c \"import torch\"`, "
        "then starts a fresh node on loopback (mDNS off, task `digits`) and takes the "
        "seconds from launch (`Popen`) to the `READY=1` datagram on its `$NOTIFY_SOCKET` "
        "(as systemd sees it), then a fresh two-namespace mesh (mDNS on, both daemons "
        "started at the same instant) and takes, per daemon, the seconds from launch to "
        "its first \"received N entries\" log line."
        + (f" Each round does the same, interleaved, with the daemon of revision "
           f"`{r['compare']}` (`git archive`, run from that tree): before and after under "
           "the same load." if r["compare"] else "")
        + f" The machine is shared with other jobs: load average {load0[0]:.1f} "
        f"(1 min) / {load0[1]:.1f} (5 min) before, {load1[0]:.1f} / {load1[1]:.1f} after; "
        "medians with min–max, and each median also as a multiple of the `import torch` "
        "median of the same run, which the load slows alike. CPU seconds (from "
        "`/proc/PID/stat` when READY=1 arrived) are what the start-up costs whatever the "
        "load: on an idle machine, wall time comes close to them.",
        "",
        "| reading | daemon | median (min–max, n) | × `import torch` |",
        "| --- | --- | --- | --- |",
        f"| `python -c \"import torch\"` | | {_spread(r['torch_import'])} | 1.0 |",
    ]
    for name in names:
        label = "this tree" if name == "now" else f"`{name}`"
        ready = r["ready"][name]
        lines.append(f"| launch → READY=1 (one node, loopback) | {label} | {_spread(ready)} "
                     f"| {statistics.median(ready) / base:.1f} |")
    cpu_base = statistics.median(r["torch_cpu"])
    lines.append(f"| CPU seconds (user + system) of `python -c \"import torch\"` | | "
                 f"{_spread(r['torch_cpu'])} | 1.0 |")
    for name in names:
        label = "this tree" if name == "now" else f"`{name}`"
        cpu = r["ready_cpu"][name]
        lines.append(f"| CPU seconds the node had used at READY=1 (loopback; all threads) | "
                     f"{label} | {_spread(cpu)} | {statistics.median(cpu) / cpu_base:.1f} |")
    if r["mesh_skipped"] is not None:
        lines += ["", f"Mesh skipped: {r['mesh_skipped']}."]
        return lines
    ratios: dict[str, float] = {}
    for key, what in (("ready", "launch → READY=1 (mesh)"),
                      ("received", "launch → first entry received (mesh)")):
        for name in names:
            label = "this tree" if name == "now" else f"`{name}`"
            values = [n[key] for run in r["mesh"][name] for n in run if n[key] is not None]
            if values:
                ratios[f"{key}/{name}"] = statistics.median(values) / base
                lines.append(f"| {what}, each of 2 daemons | {label} | {_spread(values)} | "
                             f"{ratios[f'{key}/{name}']:.1f} |")
    lines += ["", _verdict(r, base, cpu_base, ratios)]
    return lines


def _verdict(r: dict[str, Any], base: float, cpu_base: float, ratios: dict[str, float]) -> str:
    """The goal, and the ratios that carry over from a loaded machine to an idle one."""

    def of(name: str) -> str:
        wall = statistics.median(r["ready"][name]) / base
        cpu = statistics.median(r["ready_cpu"][name]) / cpu_base
        first = ratios.get(f"received/{name}")
        return (f"READY=1 after {wall:.1f}× its wall time and {cpu:.1f}× its CPU time"
                + (f", the first entry after {first:.1f}× its wall time" if first else ""))

    before = f" (revision `{r['compare']}`: {of(r['compare'])})" if r["compare"] else ""
    ready = statistics.median(r["ready"]["now"])
    firsts = [n["received"] for run in (r["mesh"] or {}).get("now", []) for n in run
              if n["received"] is not None]
    measured = f"Measured here: READY=1 after {ready:.2f} s on loopback ({_met(ready, 3.0)})"
    if firsts:
        first = statistics.median(firsts)
        measured += f", the first entry after {first:.2f} s in the mesh ({_met(first, 5.0)})"
    return ("Goal (issue 14): READY=1 within 3 s of launch and the first entry within 5 s, "
            f"on this machine without other jobs. {measured}, medians at the load average "
            "above; a loaded machine slows every reading, and what carries over is the ratio "
            f"to `import torch`: this tree {of('now')}{before}.")


def _met(seconds: float, goal: float) -> str:
    return f"goal {goal:g} s {'met' if seconds <= goal else 'missed'}"


def save_start(r: dict[str, Any], path: Path = START_JSON) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(r, indent=1) + "\n")
