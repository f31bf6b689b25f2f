"""One large entry across the namespace WAN's shaped uplink, optionally cut mid-transfer: the
run shared by tests/net/test_slowlink.py and benchmarks/bench_slowlink.py.

The receiver (tests/net/slowlink_peer.py) runs on the public segment, the sender behind site
``a``'s NAT router, so every byte crosses site a's uplink (both ends shaped: see
:class:`tests.net.wan.Link`). With ``cut_at``, the uplink is cut (:func:`tests.net.wan.cut`)
once the receiver's spool file holds that fraction of the entry frame, for ``cut_s``
seconds: long enough that both ends' kernels give up on the connection (peerd's mend 9
closes one whose data goes unacknowledged or whose keepalives go unanswered, a few seconds)
and the sender must dial again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.net.wan import Wan, cut

PORT = 4300  # inside the namespaces only
#: Every wait here is a deadline on a condition, not a measured speed.
RUN_TIMEOUT_S = 240.0


@dataclass
class Run:
    entry_bytes: int  # the signed entry frame (head + payload)
    receiver: list[dict[str, Any]] = field(default_factory=list)  # its per-session lines
    sender: list[dict[str, Any]] = field(default_factory=list)
    cut_at_bytes: int | None = None  # the spool file's size when the cut began

    @property
    def wall_s(self) -> float:
        """From the first session's start at the receiver to the end of the one that
        cached the entry (a cut included)."""
        return float(self.last["t_end"] - self.receiver[0]["t_start"])

    @property
    def bytes_in(self) -> int:
        """Every byte of every session that reached the receiver's gossip."""
        return sum(s["bytes_in"] for s in self.receiver)

    @property
    def last(self) -> dict[str, Any]:
        return self.receiver[-1]


class _Lines:
    """A child's JSON stdout lines, read on a thread (so a wait has a deadline)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self._cond:
                    self.lines.append(json.loads(line))
                    self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait(self, pred: Any, deadline: float) -> dict[str, Any]:
        with self._cond:
            while True:
                hit = next((ln for ln in self.lines if pred(ln)), None)
                if hit is not None:
                    return hit
                left = deadline - time.monotonic()
                assert left > 0, f"no such line in time; got {self.lines}"
                assert self.proc.poll() is None, f"exit {self.proc.poll()}; got {self.lines}"
                self._cond.wait(min(left, 0.5))


def _spooled(spool: Path) -> int:
    sizes = []
    for p in spool.iterdir():
        try:
            sizes.append(p.stat().st_size)
        except FileNotFoundError:  # verified and renamed, or dropped, meanwhile
            continue
    return max(sizes, default=0)


def run(w: Wan, tmp: Path, *, mb: float, encoding: str = "float32",
        cut_at: float | None = None, cut_s: float = 10.0) -> Run:
    """One transfer of an ``mb`` MB (float32) entry sent in ``encoding``: the receiver's
    and the sender's lines."""
    spool = tmp / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    peer = [sys.executable, "-m", "tests.net.slowlink_peer"]
    recv = subprocess.Popen(
        w.public[0].command([*peer, "recv", "--port", str(PORT), "--mb", str(mb), "--spool",
                             str(spool)]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    send = None
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        # Both start at once (each is seconds of imports on a loaded machine): the sender
        # dials until the receiver listens.
        send = subprocess.Popen(
            w.sites["a"].hosts[0].command([*peer, "send", "--port", str(PORT), "--mb", str(mb),
                                           "--to", w.public[0].address,
                                           "--spool", str(tmp / "sender-spool"),
                                           "--encoding", encoding]),
            stdout=subprocess.PIPE, text=True, env=env)
        r, s = _Lines(recv), _Lines(send)
        r.wait(lambda ln: "ready" in ln, deadline)
        entry = s.wait(lambda ln: "signed" in ln, deadline)["signed"]
        cut_at_bytes = None
        if cut_at is not None:
            while (got := _spooled(spool)) < cut_at * entry:
                assert time.monotonic() < deadline, "no transfer to cut"
                assert len(r.lines) == 1, f"the session ended before the cut: {r.lines}"
                time.sleep(0.02)
            cut_at_bytes = got
            with cut(w.sites["a"]):
                time.sleep(cut_s)
        s.wait(lambda ln: ln.get("sent"), deadline)
        r.wait(lambda ln: ln.get("received"), deadline)
        assert send.wait(timeout=30) == 0
        return Run(entry, list(r.lines[1:]), list(s.lines[1:]), cut_at_bytes)
    finally:
        for p in (send, recv):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.wait()
