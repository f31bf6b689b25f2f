"""Update-norm validation: the adaptive bound, its cold start, reject and clip."""

from __future__ import annotations

import math

import pytest

from peerd.core.updatenorm import (
    NormAction,
    NormHistory,
    UpdateNormPolicy,
    Verdict,
    gate,
    gated_alpha,
    scaled_weights,
    update_bound,
)

REJECT = UpdateNormPolicy(NormAction.REJECT, multiple=3.0, window=4, min_history=3)
CLIP = UpdateNormPolicy(NormAction.CLIP, multiple=3.0, window=4, min_history=3)


def test_cold_start_has_no_bound_then_median_times_multiple() -> None:
    h = NormHistory().seen([1.0, 2.0], REJECT)
    assert update_bound(REJECT, h) == math.inf  # 2 < min_history 3
    h = h.seen([10.0], REJECT)
    assert update_bound(REJECT, h) == 6.0  # 3 × median(1, 2, 10)
    assert gate([0.0, 100.0], REJECT, NormHistory((1.0, 2.0))).verdicts == (
        Verdict.ACCEPTED, Verdict.ACCEPTED)


def test_window_keeps_the_latest_finite_norms() -> None:
    h = NormHistory().seen([1.0, math.nan, 2.0, 3.0, math.inf, 4.0, 5.0], REJECT)
    assert h.norms == (2.0, 3.0, 4.0, 5.0)
    assert update_bound(REJECT, h) == 3.0 * 3.5


def test_off_never_bounds() -> None:
    off = UpdateNormPolicy()
    assert update_bound(off, NormHistory((1.0,) * 64)) == math.inf


def test_reject_drops_the_member_and_renormalises_alpha() -> None:
    h = NormHistory((1.0, 1.0, 1.0))  # bound 3
    g = gate([0.0, 2.0, 30.0, 3.0], REJECT, h)
    assert g.bound == 3.0
    assert g.verdicts == (Verdict.ACCEPTED, Verdict.ACCEPTED, Verdict.REJECTED, Verdict.ACCEPTED)
    assert gated_alpha([0.25, 0.25, 0.25, 0.25], g) == pytest.approx([1 / 3, 1 / 3, 0, 1 / 3])


def test_reject_of_every_peer_leaves_the_own_model() -> None:
    g = gate([0.0, 30.0], REJECT, NormHistory((1.0, 1.0, 1.0)))
    assert gated_alpha([0.5, 0.5], g) == [1.0, 0.0]


def test_clip_scales_the_update_to_the_bound() -> None:
    g = gate([0.0, 2.0, 30.0], CLIP, NormHistory((1.0, 1.0, 1.0)))
    assert g.verdicts == (Verdict.ACCEPTED, Verdict.ACCEPTED, Verdict.CLIPPED)
    assert g.scale == (1.0, 1.0, 0.1)
    # Own 0.5; peer 2 at α 0.25 counts 0.025, the 0.225 it loses goes to the own model.
    assert scaled_weights([0.5, 0.25, 0.25], g.scale) == pytest.approx([0.725, 0.25, 0.025])


def test_policy_checks() -> None:
    with pytest.raises(ValueError, match="multiple"):
        UpdateNormPolicy(NormAction.CLIP, multiple=0)
    with pytest.raises(ValueError, match="min_history"):
        UpdateNormPolicy(NormAction.CLIP, window=4, min_history=5)
