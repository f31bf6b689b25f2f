"""Cordial mode between real daemons, repeated: the ``long`` tests of
tests/integration/test_cordial.py run ``--runs`` times, their printed lines kept.

    sudo .venv/bin/python -m benchmarks.cordial_mesh_runs --runs 3 \
        --json docs/results/cordial-mesh/integration-runs.json

Each run is one pytest process (``-s -m long``): the two-agent test (Pairwise-10 MNIST, 40
rounds, each agent's test accuracy with its peer's views against the same agent without
them, computed in-process by the daemon's own code) and the four-daemon
mesh (``peerd demo --mode cordial --nodes 4 --task mnist``, 60 rounds, with views and
isolated; ``--no-four`` skips it). The tests assert the gap (≥ 5 points); this records what
they measured, so that docs/tasks.md renders its table from a committed output with its
provenance rather than from copied lines. Needs root and iproute2 (network namespaces; mDNS
never leaves them). Exit status 1 when a test failed (the JSON keeps its output's tail).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import _provenance

TEST = "tests/integration/test_cordial.py"
#: The tests' own printed lines (``print(...)`` in test_cordial.py, seen with ``-s``).
PAIRS = re.compile(r"test accuracy at round (\d+) \(with views, without\): (\[.*\])")
FOUR = re.compile(r"4 daemons, (\d+) rounds: mean test accuracy ([\d.]+) with views, "
                  r"([\d.]+) isolated")


def _pytest(selector: str) -> tuple[list[str], subprocess.CompletedProcess[str], float]:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s", "-m",
               "long", TEST, "-k", selector]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          cwd=_provenance.ROOT)
    return command, done, round(time.perf_counter() - t0, 1)


def pair_run(index: int) -> dict[str, Any]:
    """One run of the two-agent test: (with views, without) per agent at its last round."""
    command, done, wall = _pytest("two_agents_exchange_views_and_beat")
    found = PAIRS.search(done.stdout)
    out: dict[str, Any] = {"run": index, "wall_s": wall, "returncode": done.returncode,
                           "pytest": shlex.join(["python", *command[1:]])}
    if found is None:
        out["tail"] = (done.stdout + done.stderr)[-4000:]
        return out
    out["rounds"] = int(found[1])
    out["pairs"] = [list(p) for p in ast.literal_eval(found[2])]
    return out


def four_run() -> dict[str, Any]:
    """The four-daemon mesh, with views and isolated."""
    command, done, wall = _pytest("four_daemons")
    found = FOUR.search(done.stdout)
    out: dict[str, Any] = {"wall_s": wall, "returncode": done.returncode,
                           "pytest": shlex.join(["python", *command[1:]])}
    if found is None:
        out["tail"] = (done.stdout + done.stderr)[-4000:]
        return out
    out.update(rounds=int(found[1]), with_views=float(found[2]), isolated=float(found[3]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of the two-agent test")
    ap.add_argument("--no-four", action="store_true",
                    help="skip the four-daemon mesh (run once otherwise)")
    ap.add_argument("--json", type=Path, required=True, help="where to write the runs")
    args = ap.parse_args(argv)
    if args.runs < 0:
        ap.error("--runs must be >= 0")
    started = _provenance.start(ap, args)
    result: dict[str, Any] = {"test": TEST, "runs": []}

    def write() -> None:
        result["provenance"] = started.record()
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")

    for i in range(1, args.runs + 1):
        result["runs"].append(pair_run(i))
        print(f"run {i}: {result['runs'][-1].get('pairs')}", file=sys.stderr)
        write()  # a run cut short keeps what it had
    if not args.no_four:
        result["four"] = four_run()
        print(f"four daemons: {result['four']}", file=sys.stderr)
    write()
    failed = [r for r in result["runs"] if r["returncode"] != 0]
    return 1 if failed or result.get("four", {}).get("returncode", 0) != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
