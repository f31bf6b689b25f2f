"""benchmarks.table2_oos's fit (issue 28 item 5): the candidate whose runs match the paper's
calibration row wins, the errors are the paper's cells', and an incomplete candidate is not
fitted on."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.reproduce_tables import PAPER_TABLE2
from benchmarks.table2_oos import TAUS, fit, row_errors, window_mean


def _run(blocks: int, rs: int, tau: int, seed: int, scale: float) -> dict[str, Any]:
    m, a = PAPER_TABLE2[(rs, tau)]
    return {"blocks": blocks, "round_seconds": rs, "tau": tau, "seed": seed,
            "models": [m * scale] * 10, "ages": [a] * 10}


def test_the_candidate_matching_the_paper_is_fitted_and_its_errors_are_zero() -> None:
    runs = {(b, 60, t, s): _run(b, 60, t, s, scale)
            for b, scale in ((70, 1.3), (73, 1.0), (76, 0.8)) for t in TAUS for s in (0, 1)}
    best, scores = fit(runs, (70, 73, 76), 60, (0, 1), (3, 10))
    assert best == 73
    assert scores[70] == pytest.approx(30)
    assert scores[76] == pytest.approx(20)
    errs = row_errors(runs, 73, 60, 0, (3, 10))
    assert errs is not None
    assert errs["mape"] == pytest.approx(0, abs=1e-9)
    assert errs["age_mae"] == pytest.approx(0, abs=1e-9)
    assert (errs["in20"], errs["in03"]) == (7, 7)


def test_a_candidate_missing_a_seed_is_left_out() -> None:
    runs = {(73, 60, t, 0): _run(73, 60, t, 0, 1.0) for t in TAUS}
    assert fit(runs, (73,), 60, (0, 1), (1, 10)) == (None, {})


def test_the_window_skips_rounds_with_no_cached_model() -> None:
    assert window_mean([None, 2.0, 4.0, 9.0], (1, 3)) == 3.0
