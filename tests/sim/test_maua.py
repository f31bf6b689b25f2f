"""FedCache's MAUA (the paper's: max over rounds of the mean client accuracy) against the mean
of each client's own best round, on hand-made accuracy matrices where the two differ."""

from __future__ import annotations

import math

import numpy as np
import pytest

from peerd.sim.maua import (
    maua,
    maua_from_curve,
    mean_of_client_best,
    plateau_round,
    round_means,
)

NAN = math.nan


def test_maua_is_the_best_rounds_mean_not_the_mean_of_each_clients_best() -> None:
    # Round means 0.7 and 0.6: the paper's MAUA is round 1's 0.7. Each client's best is in a
    # different round (0.8 in round 1, 0.7 in round 2), so their mean, 0.75, is higher.
    acc = [[0.8, 0.6],
           [0.5, 0.7]]
    assert maua(acc) == pytest.approx(0.7)
    assert mean_of_client_best(acc) == pytest.approx(0.75)


def test_the_two_agree_when_one_round_is_every_clients_best() -> None:
    acc = [[0.5, 0.4, 0.3],
           [0.9, 0.8, 0.7],
           [0.6, 0.8, 0.2]]
    assert maua(acc) == pytest.approx(0.8) == mean_of_client_best(acc)


def test_a_client_without_a_test_split_is_left_out_of_both() -> None:
    # client_test_split gives a client no test images when its training share of every class
    # rounds to nothing: _evaluate then reports NaN for it at every round.
    acc = [[0.8, NAN, 0.6],
           [0.5, NAN, 0.7]]
    assert maua(acc) == pytest.approx(0.7)
    assert mean_of_client_best(acc) == pytest.approx(0.75)
    assert not np.isinf(mean_of_client_best(acc))  # np.fmax from -inf kept -inf for it


def test_a_client_missing_from_one_round_leaves_that_rounds_mean_to_the_others() -> None:
    acc = [[0.8, NAN],
           [0.4, 0.6]]
    assert list(round_means(acc)) == pytest.approx([0.8, 0.5])
    assert maua(acc) == pytest.approx(0.8)
    assert mean_of_client_best(acc) == pytest.approx(0.7)


def test_the_mean_of_client_best_never_falls_below_maua() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        acc = rng.random((rng.integers(1, 8), rng.integers(1, 12)))
        assert mean_of_client_best(acc) >= maua(acc) - 1e-12


def test_maua_from_a_curve_uses_its_mean_accuracy_column() -> None:
    acc = np.array([[0.8, 0.6], [0.5, 0.7], [0.9, 0.9]])
    means = round_means(acc)
    # Rows as a run writes them: round, mean accuracy, mean of client best so far, bytes.
    curve = [(t + 1, float(means[t]), mean_of_client_best(acc[:t + 1]), 100 * t)
             for t in range(3)]
    assert maua_from_curve(curve) == pytest.approx(maua(acc)) == pytest.approx(0.9)
    assert maua_from_curve(curve, upto=2) == pytest.approx(maua(acc[:2])) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="no evaluated round"):
        maua_from_curve(curve, upto=0)


def test_matrices_with_nothing_to_average_are_refused() -> None:
    with pytest.raises(ValueError, match="with an evaluation"):
        maua(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="no client tested"):
        maua([[NAN, NAN]])
    with pytest.raises(ValueError, match="no client tested"):
        mean_of_client_best([[NAN], [NAN]])


def _curve(means: list[float]) -> list[tuple[int, float, float, int]]:
    return [(r + 1, m, m, 0) for r, m in enumerate(means)]


def test_plateau_fires_at_the_first_round_whose_window_gains_too_little() -> None:
    # Gains of 0.05, 0.03, 0.01, then 0.001 a round: with window 2 and a 0.005 floor the
    # rows 5-6 (0.091, 0.092) beat row 4's 0.09 by only 0.002.
    means = [0.0, 0.05, 0.08, 0.09, 0.091, 0.092, 0.5]
    assert plateau_round(_curve(means), 2, 0.005) == 6
    # A larger window sees row 3's jump: it fires later, on the flat tail only.
    assert plateau_round(_curve(means[:6]), 3, 0.005) is None


def test_plateau_is_on_the_best_so_a_noisy_dip_or_spike_does_not_decide() -> None:
    climbing = [0.1, 0.2, 0.15, 0.3, 0.25, 0.4]  # dips every other round, still climbing
    assert plateau_round(_curve(climbing), 2, 0.01) is None
    spiked = [0.1, 0.5, 0.2, 0.2, 0.2]  # one lucky round early, nothing since
    assert plateau_round(_curve(spiked), 2, 0.01) == 4


def test_plateau_needs_more_rows_than_its_window_and_a_window() -> None:
    assert plateau_round(_curve([0.5, 0.5]), 2, 0.01) is None
    with pytest.raises(ValueError, match="window"):
        plateau_round(_curve([0.5, 0.5]), 0, 0.01)
