"""Drift (§3.10) in float64 and the ε publish rule."""

from __future__ import annotations

import math

import pytest
import torch

from peerd.core import drift as drift_module
from peerd.core.drift import drift, flat_distance, row_distances, should_publish


def test_seed_drift_0_8_1_1_vs_3_3_is_2_91() -> None:
    d = drift({"w": torch.tensor([0.8, 1.1])}, {"w": torch.tensor([3.0, 3.0])})
    assert round(d, 2) == 2.91
    assert d == pytest.approx(math.sqrt(2.2**2 + 1.9**2), rel=1e-6)


def test_drift_spans_all_floating_tensors() -> None:
    a = {"w": torch.tensor([0.0, 0.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([3.0, 0.0]), "b": torch.tensor([4.0])}
    assert drift(a, b) == pytest.approx(5.0)


def test_float32_values_whose_squares_overflow_float32_still_give_a_finite_distance() -> None:
    a = torch.full((1000,), 1e20, dtype=torch.float32)
    b = torch.zeros(1000)
    d = flat_distance(a, b)
    assert math.isfinite(d)
    assert d == pytest.approx(1e20 * math.sqrt(1000), rel=1e-6)


def test_drift_between_different_architectures_is_an_error() -> None:
    with pytest.raises(ValueError, match="different schemas"):
        drift({"w": torch.zeros(100)}, {"w": torch.zeros(120)})


def test_epsilon_zero_always_publishes_and_positive_epsilon_needs_movement() -> None:
    assert should_publish(0.0, 0.0)
    assert not should_publish(0.05, 0.1)
    assert not should_publish(0.1, 0.1)
    assert should_publish(0.11, 0.1)
    with pytest.raises(ValueError, match="epsilon must be finite"):
        should_publish(1.0, -1.0)


def test_a_quiet_model_is_republished_after_max_silence() -> None:
    # Issue 12, item 3: the silence bound applies only below ε, and only once due.
    assert not should_publish(0.05, 0.1, silent_for=299.0, max_silence=300.0)
    assert should_publish(0.05, 0.1, silent_for=300.0, max_silence=300.0)
    assert should_publish(0.05, 0.1, silent_for=-1.0, max_silence=300.0)  # clock stepped back
    assert not should_publish(0.05, 0.1, silent_for=1e12)  # no limit: silent for ever
    assert should_publish(0.05, 0.1, silent_for=math.inf, max_silence=300.0)  # never published
    with pytest.raises(ValueError, match="silence"):
        should_publish(0.05, 0.1, silent_for=math.nan, max_silence=300.0)
    with pytest.raises(ValueError, match="silence"):
        should_publish(0.05, 0.1, silent_for=1.0, max_silence=-1.0)


def test_row_distances_are_each_rows_flat_distance_across_chunk_boundaries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 3 rows of 7 with a 6-element budget: 2 columns per chunk, the last chunk a single column.
    monkeypatch.setattr(drift_module, "DRIFT_CHUNK", 6)
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)
    d = row_distances(a, b)
    assert d.dtype == torch.float64
    assert d.shape == (3,)
    for i in range(3):
        assert float(d[i]) == pytest.approx(flat_distance(a[i], b[i]), rel=1e-12)
    assert row_distances(a, a).tolist() == [0.0, 0.0, 0.0]


def test_row_distances_of_the_seed_pairs_and_of_overflowing_float32() -> None:
    # §16.1's scalar pairs 3.0 -> 3.05 and 3.0 -> 0.8: drifts 0.05 and 2.2.
    d = row_distances(torch.tensor([[3.05], [0.8]]), torch.tensor([[3.0], [3.0]]))
    assert d.tolist() == pytest.approx([0.05, 2.2], abs=1e-6)
    big = row_distances(torch.full((2, 1000), 1e20), torch.zeros(2, 1000))
    assert big.tolist() == pytest.approx([1e20 * math.sqrt(1000)] * 2, rel=1e-6)


def test_row_distances_leave_float64_inputs_alone_and_refuse_mismatched_shapes() -> None:
    a = torch.ones(2, 3, dtype=torch.float64)
    row_distances(a, torch.zeros(2, 3, dtype=torch.float64))
    assert a.tolist() == [[1.0] * 3] * 2
    with pytest.raises(ValueError, match=r"\[N, D\]"):
        row_distances(torch.zeros(2, 3), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="equal"):
        row_distances(torch.zeros(3), torch.zeros(3))
