"""The weights the daemon's blend actually used (the participation audit's ``weight``): the
blend they describe is the blend that was computed."""

from __future__ import annotations

import torch

from peerd.core.blend import blend_rows
from peerd.core.robust import Clipped, Krum, Median
from peerd.core.updatenorm import NormAction, NormHistory, UpdateNormPolicy
from tests.learn.test_trainer_robust import _flat, _setup


def _blended_by(weights: dict[str, float], stack: torch.Tensor) -> torch.Tensor:
    return blend_rows(stack, list(weights.values()))


def test_clipping_reports_weights_that_reproduce_its_blend() -> None:
    ops, plan, stack = _setup([0.0, 0.1, 8.0])
    ops.blend_robust([plan], Clipped(0.5))
    assert ops.weights is not None
    assert list(ops.weights) == list(plan.origins)
    assert ops.weights["p2"] < plan.alpha[3] / 4  # the far peer is clipped hard
    assert abs(sum(ops.weights.values()) - 1.0) < 1e-6
    assert torch.allclose(_flat(ops.own_params), _blended_by(ops.weights, stack), atol=1e-5)


def test_krum_reports_the_unselected_model_at_weight_zero() -> None:
    ops, plan, stack = _setup([0.0, 0.1, -0.1, 9.0])
    ops.blend_robust([plan], Krum(1))
    assert ops.weights is not None
    assert ops.weights["p3"] == 0.0
    assert torch.allclose(_flat(ops.own_params), _blended_by(ops.weights, stack), atol=1e-5)


def test_krum_refusing_keeps_the_own_model_alone() -> None:
    ops, plan, _ = _setup([0.0, 1.0])
    ops.blend_robust([plan], Krum(1))
    assert ops.weights == {"me": 1.0, "p0": 0.0, "p1": 0.0}


def test_a_rejected_update_weighs_zero_and_the_rest_are_renormalised() -> None:
    policy = UpdateNormPolicy(NormAction.REJECT, multiple=3.0, window=8, min_history=3)
    ops, plan, stack = _setup([0.0, 0.05, 5.0], norm_policy=policy,
                              norm_history=NormHistory((0.3, 0.3, 0.3)))
    ops.blend([plan])
    assert ops.weights is not None
    assert ops.weights["p2"] == 0.0
    assert all(abs(ops.weights[o] - 1 / 3) < 1e-9 for o in ("me", "p0", "p1"))
    assert torch.allclose(_flat(ops.own_params), _blended_by(ops.weights, stack), atol=1e-5)


def test_an_unchanged_weighted_blend_and_a_median_report_no_weights() -> None:
    ops, plan, _ = _setup([0.0, 0.1])
    ops.blend([plan])
    assert ops.weights is None  # the plan's α is what was used
    ops, plan, _ = _setup([0.0, 0.1, 0.2])
    ops.blend_robust([plan], Median())
    assert ops.weights is None  # per coordinate: no model has a weight
