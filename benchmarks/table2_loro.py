"""Table 2 leave-one-row-out (issue 28 item 5): the grid fitted on each epoch-length row in
turn, the other two rows predicted, rendered for docs/reproduction.md.

Three sweeps of :mod:`benchmarks.table2_oos`, identical but for ``--calibrate-on``, each in
its own output (:data:`OUTPUTS`): each file's fit and predictions are scored from that file's
runs alone, so each calibration is exactly what its command ran. A cell's simulation does not
depend on which row is the calibration row (the row only decides which cells are run), and
the cells two sweeps both ran are compared run for run (:func:`agreement`), which checks it.

Every ± is the mean ± sample standard deviation over the seeds (n stated).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import _provenance
from benchmarks.table2_oos import OUTPUT, ROWS, fit, key, row_errors
from benchmarks.table2_oos_render import WINDOWS, _pm, _table

#: The sweep calibrated on each row (epoch seconds); the 60 s one is the section's first.
OUTPUTS: dict[int, Path] = {30: OUTPUT.with_name("table2-oos-cal30.json"), 60: OUTPUT,
                            120: OUTPUT.with_name("table2-oos-cal120.json")}


@dataclass(frozen=True)
class Calibration:
    """One sweep scored: the grid fitted on ``row`` and its errors on every row it ran."""

    row: int  # the calibration row, epoch seconds
    best: int | None  # B*, None while a candidate lacks a seed on the row
    scores: dict[int, float]  # each complete candidate's objective (mean model-count MAPE, %)
    errors: dict[int, list[dict[str, float]]]  # row -> one row_errors() per seed, at B*


def calibration(doc: dict[str, Any], window: tuple[int, int] | None = None) -> Calibration:
    """Score one :mod:`benchmarks.table2_oos` output over ``window`` (default its
    protocol's): fit on its calibration row, then the errors at ``B*`` on each row whose
    every seed it ran."""
    p = doc["protocol"]
    w = (int(p["window"][0]), int(p["window"][1])) if window is None else window
    runs = {key(r): r for r in doc["runs"]}
    row, seeds = int(p["calibrate_on"]), [int(s) for s in p["seeds"]]
    best, scores = fit(runs, p["candidates"], row, seeds, w)
    if len(scores) < len(p["candidates"]):
        best = None  # an incomplete calibration fits nothing
    errors: dict[int, list[dict[str, float]]] = {}
    for rs in ROWS:
        errs = [row_errors(runs, best, rs, s, w) for s in seeds] if best is not None else []
        if errs and all(e is not None for e in errs):
            errors[rs] = [e for e in errs if e is not None]
    return Calibration(row, best, scores, errors)


def pooled(cal: Calibration) -> list[dict[str, float]] | None:
    """Per seed, the two predicted rows together (mean MAPE and age error, cells within
    20 % and 0.3 rounds of 14); None until both were run."""
    oos = [rs for rs in ROWS if rs != cal.row]
    if any(rs not in cal.errors for rs in oos):
        return None
    per_seed = zip(*(cal.errors[rs] for rs in oos), strict=True)
    return [{"mape": statistics.mean(e["mape"] for e in es),
             "age_mae": statistics.mean(e["age_mae"] for e in es),
             "in20": sum(e["in20"] for e in es), "in03": sum(e["in03"] for e in es)}
            for es in per_seed]


def agreement(docs: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """(cells run by more than one sweep, those whose every run gave the same per-round
    model counts, ages and contacts)."""
    seen: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for doc in docs:
        for run in doc["runs"]:
            seen.setdefault(key(run), []).append(run)
    shared = [rs for rs in seen.values() if len(rs) > 1]
    fields = ("models", "ages", "contacts")
    same = sum(all(r[f] == rs[0][f] for r in rs for f in fields) for rs in shared)
    return len(shared), same


def _docs() -> dict[int, dict[str, Any]]:
    return {row: json.loads(path.read_text()) for row, path in OUTPUTS.items()
            if path.is_file()}


def _errs(errs: Sequence[dict[str, float]], of: int) -> list[str]:
    return [_pm([e["mape"] for e in errs]), _pm([e["in20"] for e in errs]) + f" of {of}",
            _pm([e["age_mae"] for e in errs], 2)]


def summary(docs: Mapping[int, dict[str, Any]] | None = None) -> str:
    """Per calibration row: B*, its in-sample error and each predicted row's, apart."""
    docs = _docs() if docs is None else docs
    rows: list[list[object]] = []
    n = 0
    for row in ROWS:
        if row not in docs:
            rows.append([f"{row} s", "not run", "", "", "", "", ""])
            continue
        cal = calibration(docs[row])
        n = len(docs[row]["protocol"]["seeds"])
        if cal.best is None:
            rows.append([f"{row} s", f"incomplete ({len(cal.scores)} candidates)", "", "", "",
                         "", ""])
            continue
        for rs in (row, *(r for r in ROWS if r != row)):
            role = "in sample (fitted)" if rs == row else "predicted"
            got = _errs(cal.errors[rs], 7) if rs in cal.errors else ["not run", "", ""]
            rows.append([f"{row} s", f"**{cal.best}**" if rs == row else cal.best,
                         f"{rs} s, {role}", *got])
        both = pooled(cal)
        if both is not None:
            rows.append([f"{row} s", cal.best, "both predicted rows", *_errs(both, 14)])
    shared, same = agreement(list(docs.values()))
    prov = "\n\n".join(_provenance.line(p) for row, d in docs.items() if row != 60
                       for p in d["provenance"])
    return _table(["calibrated on", "B*", "row scored", f"model-count error, % (n = {n} seeds)",
                   "cells within 20 %", "age error, rounds"], rows) + \
        f"\n\n{shared} cells were run by more than one of the sweeps; {same} of them gave " \
        "identical per-round model counts, ages and contacts in every run.\n\n" \
        f"{prov}\n"


def objectives(docs: Mapping[int, dict[str, Any]] | None = None) -> str:
    """Each candidate's objective on each calibration row, and the B* each window picks."""
    docs = _docs() if docs is None else docs
    cals = {row: calibration(d) for row, d in docs.items()}
    cands = sorted({b for c in cals.values() for b in c.scores})
    rows: list[list[object]] = []
    for b in cands:
        rows.append([b] + [(f"**{c.scores[b]:.1f}**" if b == c.best else f"{c.scores[b]:.1f}")
                           if (c := cals.get(row)) and b in c.scores else "not run"
                           for row in ROWS])
    for w in WINDOWS:
        picks = [(calibration(docs[row], w).best or "incomplete") if row in docs else "not run"
                 for row in ROWS]
        rows.append([f"B* over rounds {w[0]}–{w[1]}", *picks])
    return _table(["blocks per side", *(f"objective on the {row} s row, %" for row in ROWS)],
                  rows) + "\n"


TABLES: dict[str, Callable[[Any], str]] = {
    "table2-oos-loro": lambda _o: summary(),
    "table2-oos-loro-fit": lambda _o: objectives(),
}
