"""benchmarks.table2_loro's leave-one-row-out scoring (issue 28 item 5): each sweep is fitted
on its own calibration row and scored on the rows it predicted, the two predicted rows pool
to 14 cells, and cells two sweeps share are compared run for run."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.reproduce_tables import PAPER_TABLE2
from benchmarks.table2_loro import agreement, calibration, pooled
from benchmarks.table2_oos import TAUS


def _run(blocks: int, rs: int, tau: int, seed: int, scale: float) -> dict[str, Any]:
    m, a = PAPER_TABLE2[(rs, tau)]
    return {"blocks": blocks, "round_seconds": rs, "tau": tau, "seed": seed,
            "models": [m * scale] * 10, "ages": [a] * 10, "contacts": [5] * 10}


def _doc(row: int, candidates: dict[int, float], predicted: dict[int, float],
         seeds: tuple[int, ...] = (0, 1)) -> dict[str, Any]:
    """A sweep calibrated on ``row`` (candidate -> scale of the paper's counts), with the
    other rows run at 73 (row -> scale)."""
    runs = [_run(b, row, t, s, scale) for b, scale in candidates.items() for t in TAUS
            for s in seeds]
    runs += [_run(73, rs, t, s, scale) for rs, scale in predicted.items() for t in TAUS
             for s in seeds]
    return {"protocol": {"calibrate_on": row, "candidates": list(candidates),
                         "seeds": list(seeds), "window": [2, 9]}, "runs": runs}


def test_the_fit_is_on_the_calibration_row_and_the_predictions_are_scored_apart() -> None:
    cal = calibration(_doc(120, {70: 1.5, 73: 1.0, 76: 0.7}, {30: 1.1, 60: 0.9}))
    assert (cal.row, cal.best) == (120, 73)
    assert cal.scores == pytest.approx({70: 50, 73: 0, 76: 30})
    assert [e["mape"] for e in cal.errors[120]] == pytest.approx([0, 0])
    assert [e["mape"] for e in cal.errors[30]] == pytest.approx([10, 10])
    assert [e["mape"] for e in cal.errors[60]] == pytest.approx([10, 10])
    both = pooled(cal)
    assert both is not None
    assert [p["in20"] for p in both] == [14, 14]
    assert [p["mape"] for p in both] == pytest.approx([10, 10])


def test_a_row_not_predicted_is_not_scored_and_does_not_pool() -> None:
    cal = calibration(_doc(30, {73: 1.3}, {60: 1.0}))
    assert cal.best == 73
    assert sorted(cal.errors) == [30, 60]
    assert [e["in20"] for e in cal.errors[30]] == [0, 0]  # 30 % off: outside 20 %
    assert pooled(cal) is None


def test_an_incomplete_calibration_fits_nothing() -> None:
    doc = _doc(30, {73: 1.0, 76: 1.0}, {60: 1.0, 120: 1.0})
    doc["runs"] = [r for r in doc["runs"] if not (r["blocks"] == 76 and r["seed"] == 1)]
    cal = calibration(doc)
    assert (cal.best, cal.errors) == (None, {})


def test_shared_cells_are_compared_run_for_run() -> None:
    a = _doc(30, {73: 1.0}, {60: 1.0, 120: 1.0})
    b = _doc(60, {73: 1.0}, {30: 1.0, 120: 1.0})
    assert agreement([a, b]) == (3 * 7 * 2, 3 * 7 * 2)
    b["runs"][0] = {**b["runs"][0], "contacts": [6] * 10}
    assert agreement([a, b]) == (42, 41)
    assert agreement([a]) == (0, 0)
