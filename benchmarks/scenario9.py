"""Integration scenario 9 as a measurement: a 4-daemon mesh against the same 4 non-IID slices
as isolated daemons (docs/integration.md, "Scenario 9 numbers").

The setting of ``tests/integration/test_scenarios.py::test_9_…``: ``digits``, ``partition =
"shards"``, seed 0, the same node_index per slice, 8 real ``peerd run`` processes on
loopback (the mesh with static peers, the isolated four with none), run side by side so that
they share the machine's load alike. Each node's validation accuracy is read at the first
status poll that finds it at or past each round of ``--read-at``. Writes the readings and the
run's provenance to ``--json``; docs/integration.md's table is rendered from it
(:func:`benchmarks.docs_outputs.scenario9`).

    .venv/bin/python -m benchmarks.scenario9 --read-at 20,25 \\
        --json docs/results/scenario9/scenario9.json
"""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import _provenance
from tests.integration.mesh import (
    STARTUP_TIMEOUT_S,
    Node,
    make_fleet,
    start,
    status,
    wait_for,
    write_overrides,
)


def _rounds(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def measure(root: Path, read_at: list[int], base_port: int) -> dict[str, Any]:
    task = {"name": "digits", "partition": "shards", "seed": 0}
    mesh = make_fleet(root / "mesh", 4, base_port=base_port, task=task)
    alone = make_fleet(root / "alone", 4, base_port=base_port + 10, task=task)
    for n in alone:
        write_overrides(n.config, network={"static_peers": []})
    nodes = mesh + alone
    running: list[Node] = []
    #: (read-at round, node dir) -> (round, val_accuracy) at the first poll past it
    reached: dict[tuple[int, Path], tuple[int, float]] = {}
    try:
        start(nodes, running)

        def all_reached() -> bool:
            for n in nodes:
                if all((r, n.dir) in reached for r in read_at):
                    continue
                s = n.status()
                if s is None:
                    continue
                for r in read_at:
                    if (r, n.dir) not in reached and s["node"]["round"] >= r:
                        reached[r, n.dir] = (s["node"]["round"], s["node"]["val_accuracy"])
            return len(reached) == len(nodes) * len(read_at)

        wait_for(all_reached, STARTUP_TIMEOUT_S + 4 * max(read_at), f"{read_at} rounds",
                 nodes)
        # Both groups name their nodes node0-3: keyed by group too. The mesh gossiped (3
        # entries each), the isolated ones never did (0), as the test asserts.
        caches = {f"{g}/{n.name}": len(status(n)["cache"])
                  for g, ns in (("mesh", mesh), ("isolated", alone)) for n in ns}
    finally:
        for n in running:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.send_signal(signal.SIGTERM)
        for n in running:
            n.stop()
    groups = {"mesh": mesh, "isolated": alone}
    return {"reads": [{"read_at": r, "group": g,
                       "nodes": [{"name": n.name, "round": reached[r, n.dir][0],
                                  "val_accuracy": reached[r, n.dir][1]} for n in ns]}
                      for r in read_at for g, ns in groups.items()],
            "cache_entries": caches}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--read-at", type=_rounds, default=[20, 25],
                    help="rounds at which each node's accuracy is read (comma list)")
    ap.add_argument("--base-port", type=int, default=27950)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    started = _provenance.start(ap, args)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="peerd-scenario9-") as tmp:
        out = measure(Path(tmp), args.read_at, args.base_port)
    out["wall_s"] = round(time.monotonic() - t0, 1)
    out["provenance"] = started.record()
    for read in out["reads"]:
        acc = [n["val_accuracy"] for n in read["nodes"]]
        print(f"round {read['read_at']} {read['group']:8} "
              + " ".join(f"{a:.3f}" for a in acc) + f"  mean {sum(acc) / len(acc):.3f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
