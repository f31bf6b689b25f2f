"""Table 2 out of sample (issue 28 item 5): fit the grid on one row, predict the other two.

The protocol, fixed before any run (and recorded in the output's ``protocol``):

* **Fitted: one parameter**, the number of blocks per side ``B`` of the square Manhattan grid
  (``--blocks B``). Everything else is held at the values the issue gave before any fitting:
  block length 50 m, N = 100 agents, 100 m range, 13.89 m/s, unlimited capacity, 50 rounds.
* **Calibration data: one epoch-length row** of the paper's Table 2 (default the 60 s row,
  its 7 τ_max cells), 3 seeds. ``B*`` is the candidate with the smallest mean over seeds of
  the row's mean absolute relative error of the *model count*; the age is not fitted on.
* **Predicted: the other two rows** (30 s and 120 s, 14 cells), run once at ``B*`` with
  nothing changed, 3 seeds.
* **Averaging window** for the fit and the headline errors: rounds 21–50 (the committed
  Table 2's ``--stats-from 21``). Every run keeps its per-round cache statistics, so the
  renderer can show how the errors and the fitted ``B`` move with other windows.

    nice -n 10 .venv/bin/python -m benchmarks.table2_oos            # both phases, resumable

Writes ``docs/reproduction/table2-oos.json`` after every run (so an interrupted sweep keeps
what it ran; a rerun skips the runs it holds), with the provenance of every invocation that
added runs. :mod:`benchmarks.table2_oos_render` renders docs/reproduction.md's tables from it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import _provenance

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "reproduction" / "table2-oos.json"
ROWS = (30, 60, 120)  # the paper's epoch lengths (s), one Table 2 row each
TAUS = (1, 2, 3, 4, 5, 10, 20)  # the paper's τ_max; peerd's --tau-max is one less
#: Blocks per side, about 7 % apart around the committed 73; the middle ones run first.
CANDIDATES = (73, 68, 78, 64, 84, 60, 90)
WINDOW = (21, 50)

Key = tuple[int, int, int, int]  # blocks, round seconds, paper τ_max, seed


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {text!r}") from None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.table2_oos",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidates", type=_ints, default=CANDIDATES,
                    help="blocks per side to try on the calibration row")
    ap.add_argument("--block-length", type=float, default=50.0, help="metres, not fitted")
    ap.add_argument("--calibrate-on", type=int, default=60, choices=ROWS,
                    help="the Table 2 row (epoch seconds) the grid is fitted on")
    ap.add_argument("--seeds", type=_ints, default=(0, 1, 2))
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--window", type=_ints, default=WINDOW,
                    help="first,last round the fit averages over")
    ap.add_argument("--phase", default="both", choices=("calibrate", "predict", "both"))
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel, one thread each")
    ap.add_argument("--out", type=Path, default=OUTPUT)
    return ap


def sim_config(blocks: int, block_length: float, round_seconds: int, tau: int, seed: int,
               rounds: int) -> Any:
    """The committed Table 2's configuration (benchmarks.reproduce_tables.TABLE2_BASE) with
    the grid, row, τ_max and seed of one cell."""
    from benchmarks.reproduce_tables import TABLE2_BASE

    return replace(TABLE2_BASE, blocks=blocks, block_length=block_length,
                   round_seconds=round_seconds, tau_max=float(tau - 1), seed=seed,
                   rounds=rounds, stats_from=1)


def _one(job: tuple[Key, float, int]) -> dict[str, Any]:
    import torch

    from benchmarks.reproduce import command
    from peerd.sim.runner import run

    torch.set_num_threads(1)
    (blocks, rs, tau, seed), block_length, rounds = job
    config = sim_config(blocks, block_length, rs, tau, seed, rounds)
    t0 = time.perf_counter()
    result = run(config)
    rows = [r for r in result.records if r.algorithm == "cached-dfl"]
    return {"blocks": blocks, "round_seconds": rs, "tau": tau, "seed": seed,
            "command": command(config), "wall_s": round(time.perf_counter() - t0, 1),
            "models": [_num(r.cache_avg_models) for r in rows],
            "ages": [_num(r.cache_avg_age) for r in rows],
            "contacts": [r.contacts for r in rows]}


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 4)  # NaN: no agent held a model that round


def key(run: dict[str, Any]) -> Key:
    return int(run["blocks"]), int(run["round_seconds"]), int(run["tau"]), int(run["seed"])


# ---- errors against the paper (shared with the renderer) -----------------------------------

def window_mean(values: Sequence[float | None], window: tuple[int, int]) -> float:
    first, last = window
    vals = [v for v in values[first - 1:last] if v is not None]
    return sum(vals) / len(vals) if vals else math.nan


def cell(run: dict[str, Any], window: tuple[int, int]) -> tuple[float, float]:
    """(average cached models, average age) of one run over ``window``."""
    return window_mean(run["models"], window), window_mean(run["ages"], window)


def row_errors(runs: dict[Key, dict[str, Any]], blocks: int, rs: int, seed: int,
               window: tuple[int, int]) -> dict[str, float] | None:
    """One seed's errors on one row: mean |relative error| of the model count (%), cells
    within 20 %, mean |age error| (rounds), cells within 0.3; None if a cell was not run."""
    from benchmarks.reproduce_tables import PAPER_TABLE2

    rel, age, in20, in03 = [], [], 0, 0
    for tau in TAUS:
        run = runs.get((blocks, rs, tau, seed))
        if run is None:
            return None
        (m, a), (pm, pa) = cell(run, window), PAPER_TABLE2[(rs, tau)]
        rel.append(abs(m - pm) / pm * 100)
        age.append(abs(a - pa))
        in20 += abs(m - pm) / pm <= 0.2
        in03 += abs(a - pa) <= 0.3
    return {"mape": statistics.mean(rel), "in20": in20, "age_mae": statistics.mean(age),
            "in03": in03}


def fit(runs: dict[Key, dict[str, Any]], candidates: Sequence[int], rs: int,
        seeds: Sequence[int], window: tuple[int, int]) -> tuple[int | None, dict[int, float]]:
    """The fitted blocks per side on row ``rs`` (None if no candidate has every seed), and
    each complete candidate's objective: the mean over seeds of the row's model-count MAPE."""
    scores: dict[int, float] = {}
    for b in candidates:
        errs = [row_errors(runs, b, rs, s, window) for s in seeds]
        if all(e is not None for e in errs):
            scores[b] = statistics.mean(e["mape"] for e in errs if e is not None)
    best = min(scores, key=lambda b: (scores[b], b)) if scores else None
    return best, scores


# ---- the sweep ------------------------------------------------------------------------------

def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _save(path: Path, doc: dict[str, Any]) -> None:
    doc["runs"].sort(key=key)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def _execute(todo: list[Key], args: argparse.Namespace, doc: dict[str, Any],
             started: _provenance.Started, invocation: int) -> None:
    jobs = [(k, args.block_length, args.rounds) for k in todo]
    runs: Iterator[dict[str, Any]]
    if args.jobs > 1:
        pool = ProcessPoolExecutor(max_workers=args.jobs)
        runs = pool.map(_one, jobs)
    else:
        runs = map(_one, jobs)
    for run in runs:
        run["invocation"] = invocation
        doc["runs"].append(run)
        doc["provenance"][invocation] = started.record()
        _save(args.out, doc)
        print(f"B={run['blocks']} {run['round_seconds']} s τ_max {run['tau']} "
              f"seed {run['seed']}: {run['wall_s']} s", flush=True)
    if args.jobs > 1:
        pool.shutdown()


def protocol(args: argparse.Namespace) -> dict[str, Any]:
    return {"fitted": "blocks", "candidates": list(args.candidates),
            "block_length": args.block_length, "calibrate_on": args.calibrate_on,
            "predict": [r for r in ROWS if r != args.calibrate_on], "seeds": list(args.seeds),
            "rounds": args.rounds, "window": list(args.window), "taus": list(TAUS),
            "objective": "mean over seeds of the calibration row's mean |relative error| "
                         "of the average cached-model count (the age is not fitted on)"}


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if len(args.window) != 2 or not 1 <= args.window[0] <= args.window[1] <= args.rounds:
        ap.error(f"--window must be first,last within 1..{args.rounds}")
    started = _provenance.start(ap, args)
    doc = load(args.out)
    if doc and doc.get("protocol") != protocol(args):
        print(f"error: {args.out} holds another protocol; move it or pass the same options",
              file=sys.stderr)
        return 2
    doc = doc or {"protocol": protocol(args), "runs": [], "provenance": []}
    have = {key(r) for r in doc["runs"]}
    invocation = len(doc["provenance"])
    doc["provenance"].append(started.record())
    window = (args.window[0], args.window[1])
    if args.phase in ("calibrate", "both"):
        todo = [(b, args.calibrate_on, t, s) for b in args.candidates for s in args.seeds
                for t in TAUS if (b, args.calibrate_on, t, s) not in have]
        _execute(todo, args, doc, started, invocation)
    if args.phase in ("predict", "both"):
        runs = {key(r): r for r in doc["runs"]}
        best, scores = fit(runs, args.candidates, args.calibrate_on, args.seeds, window)
        if best is None or len(scores) < len(args.candidates):
            print(f"error: the calibration is incomplete ({len(scores)} of "
                  f"{len(args.candidates)} candidates run); run --phase calibrate first",
                  file=sys.stderr)
            return 2
        print(f"fitted: --blocks {best} (objective {scores[best]:.2f} %)", flush=True)
        todo = [(best, rs, t, s) for rs in ROWS if rs != args.calibrate_on for s in args.seeds
                for t in TAUS if (best, rs, t, s) not in have]
        _execute(todo, args, doc, started, invocation)
    doc["provenance"][invocation] = started.record()
    _save(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
