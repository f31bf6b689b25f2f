"""docs/reproduction.md's Table 2 out-of-sample tables, rendered from the committed
``docs/reproduction/table2-oos.json`` and, for the finer grid, ``table2-oos-fine.json``
(:mod:`benchmarks.table2_oos` writes them) and nothing else; registered in :data:`TABLES` so tests/docs re-renders and diffs them (issue 28 item 5).

Every ± is the mean ± sample standard deviation over the seeds (n stated).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import _provenance
from benchmarks.table2_oos import OUTPUT, TAUS, Key, cell, fit, key, row_errors

#: Windows (first, last round) the verdict is re-read over; the first is the protocol's.
WINDOWS = ((21, 50), (21, 35), (36, 50), (11, 50))


def _doc(path: Path = OUTPUT) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _runs(doc: dict[str, Any]) -> dict[Key, dict[str, Any]]:
    return {key(r): r for r in doc["runs"]}


def _pm(values: Sequence[float], digits: int = 1) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    return "\n".join([_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)])


def _setup(doc: dict[str, Any]) -> tuple[dict[Key, dict[str, Any]], int, list[int],
                                          tuple[int, int], int]:
    p = doc["protocol"]
    window = (int(p["window"][0]), int(p["window"][1]))
    runs = _runs(doc)
    best, _ = fit(runs, p["candidates"], p["calibrate_on"], p["seeds"], window)
    if best is None:
        raise ValueError("table2-oos.json: the calibration is incomplete")
    return runs, int(p["calibrate_on"]), list(p["seeds"]), window, best


def calibration(doc: dict[str, Any] | None = None) -> str:
    """The fit: each candidate's error on the calibration row."""
    doc = _doc() if doc is None else doc
    runs, rs, seeds, window, best = _setup(doc)
    _, scores = fit(runs, doc["protocol"]["candidates"], rs, seeds, window)
    rows = []
    for b in sorted(scores):
        errs = [e for s in seeds if (e := row_errors(runs, b, rs, s, window)) is not None]
        rows.append([f"**{b}**" if b == best else b, f"{b * doc['protocol']['block_length']:.0f}",
                     _pm([e["mape"] for e in errs]), _pm([e["in20"] for e in errs]),
                     _pm([e["age_mae"] for e in errs], 2)])
    n = len(seeds)
    return _table(["blocks per side", "side (m)", f"model-count error, % (n = {n})",
                   "cells within 20 % (of 7)", "age error, rounds"], rows) + \
        f"\n\nFitted: `--blocks {best}` (the smallest mean model-count error on the {rs} s row, " \
        f"rounds {window[0]}–{window[1]}).\n"


def _role_rows(runs: dict[Key, dict[str, Any]], best: int, cal: int, seeds: Sequence[int],
               window: tuple[int, int]) -> list[list[object]]:
    rows: list[list[object]] = []
    for rs in (cal, *sorted(r for r in (30, 60, 120) if r != cal)):
        errs = [e for s in seeds if (e := row_errors(runs, best, rs, s, window)) is not None]
        if len(errs) < len(seeds):
            continue
        role = "in sample (fitted)" if rs == cal else "out of sample (predicted)"
        rows.append([f"{rs} s", role, _pm([e["mape"] for e in errs]),
                     _pm([e["in20"] for e in errs]), _pm([e["age_mae"] for e in errs], 2),
                     _pm([e["in03"] for e in errs])])
    return rows


def summary(doc: dict[str, Any] | None = None) -> str:
    """In-sample and out-of-sample errors at the fitted grid, reported apart."""
    doc = _doc() if doc is None else doc
    runs, cal, seeds, window, best = _setup(doc)
    rows = _role_rows(runs, best, cal, seeds, window)
    oos = [rs for rs in (30, 60, 120) if rs != cal]
    pooled = []
    for s in seeds:
        es = [row_errors(runs, best, rs, s, window) for rs in oos]
        if all(e is not None for e in es):
            pooled.append([e for e in es if e is not None])
    if len(pooled) == len(seeds):
        rows.append([" + ".join(f"{r} s" for r in oos), "out of sample, both rows",
                     _pm([statistics.mean(e["mape"] for e in p) for p in pooled]),
                     _pm([sum(e["in20"] for e in p) for p in pooled]) + " of 14",
                     _pm([statistics.mean(e["age_mae"] for e in p) for p in pooled], 2),
                     _pm([sum(e["in03"] for e in p) for p in pooled]) + " of 14"])
    walls = [float(r["wall_s"]) for r in doc["runs"]]
    prov = "\n\n".join(_provenance.line(p) for p in doc["provenance"])
    return _table(["row", "role", f"model-count error, % (n = {len(seeds)} seeds)",
                   "cells within 20 % (of 7)", "age error, rounds", "cells within 0.3 rounds"],
                  rows) + \
        f"\n\n`--blocks {best}`, block length {doc['protocol']['block_length']:g} m, rounds " \
        f"{window[0]}–{window[1]}. {len(walls)} runs, {min(walls):.0f}–{max(walls):.0f} s " \
        f"each, {sum(walls) / 60:.0f} min in all.\n\n{prov}\n"


def cells(doc: dict[str, Any] | None = None) -> str:
    """Every cell at the fitted grid: mean ± std over seeds against the paper."""
    from benchmarks.reproduce_tables import PAPER_TABLE2

    doc = _doc() if doc is None else doc
    runs, cal, seeds, window, best = _setup(doc)
    rows = []
    for rs in (30, 60, 120):
        for tau in TAUS:
            got = [cell(r, window) for s in seeds if (r := runs.get((best, rs, tau, s)))]
            if len(got) < len(seeds):
                continue
            pm, pa = PAPER_TABLE2[(rs, tau)]
            rel = [(m - pm) / pm * 100 for m, _ in got]
            rows.append([rs, "fitted" if rs == cal else "predicted", tau,
                         _pm([m for m, _ in got], 2), f"{pm:.1f}", _pm(rel, 0) + " %",
                         _pm([a for _, a in got], 2), f"{pa:.1f}"])
    return _table(["round (s)", "role", "τ_max (paper)", f"models (n = {len(seeds)})",
                   "paper", "error", "age (rounds)", "paper age"], rows) + "\n"


def windows(doc: dict[str, Any] | None = None) -> str:
    """How the verdict moves with the averaging window (fit redone per window)."""
    doc = _doc() if doc is None else doc
    runs, cal, seeds, window, best = _setup(doc)
    oos = [rs for rs in (30, 60, 120) if rs != cal]
    rows = []
    for w in WINDOWS:
        wbest, _ = fit(runs, doc["protocol"]["candidates"], cal, seeds, w)
        ins = [e for s in seeds if (e := row_errors(runs, best, cal, s, w)) is not None]
        out = [[row_errors(runs, best, rs, s, w) for rs in oos] for s in seeds]
        full = [[e for e in p if e is not None] for p in out]
        one = [cell(r, w)[0] for s in seeds if (r := runs.get((best, 60, 1, s)))]
        rows.append([f"{w[0]}–{w[1]}" + (" (protocol)" if w == window else ""), wbest,
                     _pm([e["mape"] for e in ins]),
                     _pm([statistics.mean(e["mape"] for e in p) for p in full]),
                     _pm([sum(e["in20"] for e in p) for p in full]) + " of 14",
                     _pm(one, 2)])
    return _table(["rounds averaged", "blocks the fit picks", f"in-sample error, % (at {best})",
                   "out-of-sample error, %", "predicted cells within 20 %",
                   "models, 60 s, τ_max 1 (paper 1.7)"], rows) + "\n"


#: The same protocol on a finer candidate grid around 73 (one block, ~1.4 %, apart).
FINE = OUTPUT.with_name("table2-oos-fine.json")

TABLES: dict[str, Callable[[Any], str]] = {
    "table2-oos-fit": lambda _o: calibration(),
    "table2-oos": lambda _o: summary(),
    "table2-oos-cells": lambda _o: cells(),
    "table2-oos-windows": lambda _o: windows(),
    "table2-oos-fine-fit": lambda _o: calibration(_doc(FINE)),
    "table2-oos-fine": lambda _o: summary(_doc(FINE)),
}
