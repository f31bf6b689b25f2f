"""The memory benchmark's breakdown (``benchmarks.bench_daemon``, part 3): the daemon's own
steps (build, round, receive, persist) run one at a time in one process, with memory read
around each, to show which of them allocate how many model sizes.

Run by ``bench_daemon`` in a child process (``--breakdown-child``), so the readings are of a
fresh interpreter. Uses bench_daemon's task and settings; owns only this phase.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._daemons import REPO, make_fleet, vm_of, write_config
from benchmarks.bench_daemon import (
    EXCHANGE_TIMEOUT_S,
    MEMORY_LEARNING,
    PARAMS_ENV,
    START_TIMEOUT_S,
    model_bytes,
)
from peerd.net.framing import FramedStream

#: Received frames arrive in pieces of this size (a Noise/Yamux message is 64 KiB).
RECEIVE_CHUNK = 64 * 1024


def _trim() -> None:
    """Return freed heap to the OS (glibc), so a reading shows live memory only."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)


def _self_vm() -> dict[str, int]:
    return vm_of(Path("/proc/self/status").read_text())


class _ChunkFeed(FramedStream):
    """A stream that yields one signed entry's frame (length prefix included) in chunks,
    as the network would, without building the frame in memory first."""

    peer_id = "bench"

    def __init__(self, message: Any) -> None:
        head, payload = message.head(), memoryview(message.payload)
        self._parts = [struct.pack(">I", len(head) + len(payload)) + head, payload]
        self._pos = 0

    async def read_some(self, max_bytes: int) -> bytes:
        while self._parts and self._pos == len(self._parts[0]):
            self._parts.pop(0)
            self._pos = 0
        part = self._parts[0]
        chunk = bytes(part[self._pos:self._pos + min(max_bytes, RECEIVE_CHUNK)])
        self._pos += len(chunk)
        return chunk

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        raise NotImplementedError


def breakdown_child(params: int, capacity: int) -> dict[str, Any]:
    """Run the daemon's own steps in this process, one at a time, reading memory around each.

    Before each step freed heap is trimmed and VmHWM reset (``/proc/self/clear_refs`` 5), so
    "peak" is the step's own transient high-water mark and "live" what it leaves allocated.
    """
    import trio

    from peerd.daemon.config import load_config
    from peerd.daemon.daemon import Daemon as PeerDaemon
    from peerd.net.gossip import read_entry
    from peerd.node.state import sign_own, verify
    from peerd.store.keyfile import NODE_KEY_FILE, read_private_key

    steps: list[dict[str, Any]] = []

    def step(name: str, fn: Callable[[], object]) -> object:
        _trim()
        Path("/proc/self/clear_refs").write_text("5")
        before = _self_vm()["VmRSS"]
        out = fn()
        held = _self_vm()
        _trim()
        steps.append({"step": name, "peak": held["VmHWM"] - before,
                      "untrimmed": held["VmRSS"] - before,
                      "live": _self_vm()["VmRSS"] - before})
        return out

    os.environ[PARAMS_ENV] = str(params)
    with tempfile.TemporaryDirectory(prefix="peerd-bench-") as tmp:
        m, *peers = make_fleet(Path(tmp), capacity + 1)
        write_config(m, static=[], mdns=False, learning={**MEMORY_LEARNING, "capacity": capacity},
                     task={"name": "benchmarks.bench_daemon:bench_task"})
        d = step("build the daemon (model)", lambda: PeerDaemon(load_config(m.config)))
        assert isinstance(d, PeerDaemon)
        step("round 1: train, sign, persist own entry (no peers)", lambda: trio.run(d._round))
        messages = []
        for i, p in enumerate(peers):
            key = read_private_key(p.dir / NODE_KEY_FILE)
            _, message = sign_own(key, d.node.fleet_id, params=dict(d.model.state_dict()),
                                  version=i + 1, created_at=time.time(), num_examples=10)
            messages.append(message)

        def receive() -> None:
            for message in messages:
                # The daemon's own receive path (peerd.net.gossip.read_entry: framing, spooled
                # to the state directory) fed in network-sized chunks, then its verify.
                entry, frame = trio.run(read_entry, _ChunkFeed(message), 2**31, d.state.blobs)
                v = verify(entry, fleet_id=d.node.fleet_id, manifest=d.node.manifest,
                           ledger=d.node.ledger.view(), schema=d.node.schema, limits=d.node.limits,
                           now=time.time(), frame=frame)
                assert d.node.accept(v, sender=m.id, now=time.time()) is None

        step(f"receive {capacity} entries: spool to disk, verify, merge", receive)
        messages.clear()  # the senders' copies: not part of the receiving daemon
        step("persist the received entries", lambda: d._persist())
        step(f"round 2: blend {capacity} entries, train, sign, persist", lambda: trio.run(d._round))
        step("round 3: the same again", lambda: trio.run(d._round))
    return {"model_bytes": model_bytes(params), "steps": steps}


def bench_breakdown(params: int, capacity: int) -> dict[str, Any]:
    import json

    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_daemon", "--breakdown-child",
                          "--params", str(params), "--capacity", str(capacity)],
                         capture_output=True, text=True, cwd=REPO, check=True,
                         timeout=START_TIMEOUT_S + EXCHANGE_TIMEOUT_S).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def breakdown_report(r: dict[str, Any]) -> list[str]:
    size = r["model_bytes"]
    lines = [
        "Where it goes: the daemon's own steps run one at a time in one process (same model, "
        "same settings), with freed heap trimmed (`malloc_trim`) and VmHWM reset before each "
        "step. In model sizes:",
        "",
        "| step | transient peak | left allocated | of which freed but kept by the allocator |",
        "| --- | --- | --- | --- |",
    ]
    for s in r["steps"]:
        lines.append(f"| {s['step']} | {s['peak'] / size:+.1f} × | {s['live'] / size:+.1f} × "
                     f"| {(s['untrimmed'] - s['live']) / size:+.1f} × |")
    return lines
