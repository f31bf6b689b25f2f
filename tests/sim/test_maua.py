"""FedCache's MAUA (the paper's: max over rounds of the mean client accuracy) against the mean
of each client's own best round, on hand-made accuracy matrices where the two differ."""

from __future__ import annotations

import math

import numpy as np
import pytest

from peerd.sim.maua import maua, maua_from_curve, mean_of_client_best, round_means

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
