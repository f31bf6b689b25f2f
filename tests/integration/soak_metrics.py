"""What the soak (tests/integration/soak.py) watches while it runs: a sampler thread that polls
every running daemon's status and its process (RSS, open file descriptors), checks the
invariants on every sample, and adds up each daemon's counters across its restarts.

Invariants checked on every sample:
- a node's round, version and published version never go below what it showed before, also
  across SIGKILL and restart (they are persisted);
- an entry a node caches of an origin is never older than one it cached before (until it
  expires, which removes the row rather than lowering it);
- no peer row ever names a node that is not a member (strangers, fake mDNS instances).

It owns no daemon: it only reads status over the control socket and /proc.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integration.mesh import Node

#: Seconds between two samples of one daemon.
SAMPLE_EVERY_S = 1.0


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except OSError:
        return None


def slope_per_h(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, per hour."""
    if len(points) < 10:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx * 3600


@dataclass
class Sampler:
    nodes: list[Node]
    members: set[str]
    t0: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: (node, pid) -> [(t, rss MB, fds)]
    resources: dict[tuple[str, int], list[tuple[float, float, int]]] = field(
        default_factory=dict)
    #: The last status of each node's running process (its counters since it started).
    last: dict[str, dict[str, Any]] = field(default_factory=dict)
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    highest: dict[tuple[str, str], int] = field(default_factory=dict)
    cached: dict[tuple[str, str], int] = field(default_factory=dict)
    regressions: list[dict[str, Any]] = field(default_factory=list)
    cache_regressions: list[dict[str, Any]] = field(default_factory=list)
    non_members: set[str] = field(default_factory=set)
    max_peer_rows: int = 0
    samples: int = 0
    status_failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- counters across restarts
    def absorb(self, node: Node) -> None:
        """Add ``node``'s counters (its last status) to the totals: before it is killed or
        stopped, while the caller holds :attr:`lock`."""
        s = node.status(timeout=5.0) or self.last.get(node.name)
        self.last.pop(node.name, None)
        if s is None:
            return
        self.accepted += s["accepted"]
        self.rejected.update(s["rejected"])
        self.dropped.update(s["dropped"])

    def absorb_all(self) -> None:
        with self.lock:
            for node in self.nodes:
                if node.alive():
                    self.absorb(node)

    # -- one sample
    def check(self, node: Node, s: dict[str, Any]) -> None:
        t = round(self.now(), 1)
        n = s["node"]
        for key in ("round", "version", "published_version"):
            value = n[key]
            if value is None:
                continue
            before = self.highest.get((node.name, key))
            if before is not None and value < before:
                self.regressions.append({"t": t, "node": node.name, "field": key,
                                         "before": before, "after": value})
            self.highest[(node.name, key)] = max(value, before or value)
        for row in s["cache"]:
            k = (node.name, row["origin"])
            before = self.cached.get(k)
            if before is not None and row["version"] < before:
                self.cache_regressions.append({"t": t, "node": node.name,
                                               "origin": row["origin"], "before": before,
                                               "after": row["version"]})
            self.cached[k] = max(row["version"], before or row["version"])
        ids = {p["id"] for p in s["peers"]}
        self.non_members |= ids - self.members
        self.max_peer_rows = max(self.max_peer_rows, len(ids))

    def sample_once(self) -> None:
        with self.lock:
            live = [(node, node.proc.pid) for node in self.nodes
                    if node.proc is not None and node.proc.poll() is None]
        for node, pid in live:
            rss, fds = rss_mb(pid), open_fds(pid)
            s = node.status(timeout=5.0)
            with self.lock:
                if node.proc is None or node.proc.pid != pid:
                    continue  # killed meanwhile: this sample belongs to no one
                if rss is not None and fds is not None:
                    self.resources.setdefault((node.name, pid), []).append(
                        (self.now(), rss, fds))
                if s is None:
                    self.status_failures += 1
                    continue
                self.samples += 1
                self.last[node.name] = s
                self.check(node, s)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample_once()
            self._stop.wait(max(0.0, SAMPLE_EVERY_S - (time.monotonic() - started)))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    # -- figures
    def resource_figures(self, warmup_s: float) -> dict[str, Any]:
        """Per node: RSS and fd slope over its longest-lived process after ``warmup_s`` of
        that process (start-up imports and the first rounds grow memory once)."""
        out: dict[str, Any] = {}
        for node in self.nodes:
            runs = [(pid, pts) for (name, pid), pts in self.resources.items()
                    if name == node.name]
            if not runs:
                continue
            _pid, pts = max(runs, key=lambda r: r[1][-1][0] - r[1][0][0])
            steady = [p for p in pts if p[0] - pts[0][0] >= warmup_s] or pts
            rss = slope_per_h([(p[0], p[1]) for p in steady])
            fds = slope_per_h([(p[0], float(p[2])) for p in steady])
            out[node.name] = {
                "processes": len(runs), "longest_process_s": round(pts[-1][0] - pts[0][0]),
                "measured_s": round(steady[-1][0] - steady[0][0]),
                "rss_mb_first": round(steady[0][1], 1), "rss_mb_last": round(steady[-1][1], 1),
                "rss_mb_max": round(max(p[1] for p in pts), 1),
                "rss_mb_per_h": None if rss is None else round(rss, 2),
                "fds_first": steady[0][2], "fds_last": steady[-1][2],
                "fds_max": max(p[2] for p in pts),
                "fds_per_h": None if fds is None else round(fds, 2),
            }
        return out
