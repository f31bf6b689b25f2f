"""The robust blend rules on hand-computed stacks, their parsing, and the block-wise daemon
path against the whole-stack function."""

from __future__ import annotations

import math

import pytest
import torch

from peerd.core.alpha import AlphaPolicy
from peerd.core.robust import (
    Clipped,
    Krum,
    Median,
    RobustError,
    RobustRule,
    Trimmed,
    clip_weights,
    krum_select,
    parse_rule,
    robust_blend_into,
    robust_blend_rows,
)
from peerd.core.round import BlendPolicy, RoundAgent, cached_dfl_round, parse_blend
from peerd.core.staleness import Clock
from tests.core.helpers import item, meta


def _stack(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_median_odd_and_even() -> None:
    odd = _stack([[1, 10], [3, -2], [2, 100]])
    assert robust_blend_rows(odd, [1 / 3] * 3, Median()).tolist() == [2.0, 10.0]
    even = _stack([[1, 0], [4, 0], [2, 8], [100, 8]])
    # Middle pairs (2, 4) and (0, 8): their means.
    assert robust_blend_rows(even, [0.25] * 4, Median()).tolist() == [3.0, 4.0]


def test_median_ignores_alpha() -> None:
    s = _stack([[0.0], [1.0], [9.0]])
    assert robust_blend_rows(s, [0.98, 0.01, 0.01], Median()).tolist() == [1.0]


def test_trimmed_mean_cuts_floor_beta_n_per_side() -> None:
    s = _stack([[1], [2], [3], [4], [100]])
    # β = 0.2, n = 5: one cut per side → mean(2, 3, 4) = 3.
    assert robust_blend_rows(s, [0.2] * 5, Trimmed(0.2)).tolist() == [3.0]
    # β = 0.1: floor(0.5) = 0 cut → the plain mean 22.
    assert robust_blend_rows(s, [0.2] * 5, Trimmed(0.1)).tolist() == [22.0]


def test_trimmed_mean_with_ties() -> None:
    s = _stack([[5, 1], [1, 1], [5, 1], [1, 7]])
    # β = 0.25, n = 4: one cut per side. Column 0 sorted 1 1 5 5 → mean(1, 5) = 3;
    # column 1 sorted 1 1 1 7 → mean(1, 1) = 1: which of the tied rows goes does not matter.
    assert robust_blend_rows(s, [0.25] * 4, Trimmed(0.25)).tolist() == [3.0, 1.0]


def test_clipping_leaves_small_updates_untouched() -> None:
    s = _stack([[0, 0], [0.3, 0.4], [-0.6, 0.8]])  # distances 0.5 and 1.0 from own
    alpha = [0.5, 0.25, 0.25]
    got = robust_blend_rows(s, alpha, Clipped(1.0))
    want = torch.tensor(alpha) @ s  # within τ: exactly the weighted blend
    assert torch.allclose(got, want)
    assert clip_weights(alpha, [0.0, 0.5, 1.0], 1.0) == [0.5, 0.25, 0.25]


def test_clipping_scales_a_large_update_to_tau() -> None:
    s = _stack([[1, 1], [1, 1], [4, 5]])  # row 2 is 5 away from own: (3, 4)
    got = robust_blend_rows(s, [0.5, 0.25, 0.25], Clipped(1.0))
    # x_own + 0.25 · (3, 4)/5 = (1 + 0.15, 1 + 0.2)
    assert torch.allclose(got, torch.tensor([1.15, 1.2]))
    assert clip_weights([0.5, 0.25, 0.25], [0.0, 0.0, 5.0], 1.0) == pytest.approx(
        [0.7, 0.25, 0.05])


def test_krum_refuses_n_at_most_2f_plus_2() -> None:
    s = _stack([[0.0]] * 4)
    with pytest.raises(RobustError, match=r"more than 2f \+ 2 = 4 models, got 4"):
        robust_blend_rows(s, [0.25] * 4, Krum(1))
    robust_blend_rows(_stack([[0.0]] * 5), [0.2] * 5, Krum(1))  # n = 5 > 4: fine


def test_krum_selects_the_n_minus_f_closest_and_renormalises_alpha() -> None:
    s = _stack([[0], [1], [2], [3], [50]])
    d = torch.tensor([[float((i - j) ** 2) for j in (0, 1, 2, 3, 50)] for i in (0, 1, 2, 3, 50)],
                     dtype=torch.float64)
    # f = 1, k = n − f − 2 = 2 neighbours: scores 0: 1+4=5, 1: 1+1=2, 2: 2, 3: 1+4=5,
    # 50: 47²+48². Keep n − f = 4: rows 0-3.
    assert krum_select(d, 1) == [0, 1, 2, 3]
    got = robust_blend_rows(s, [0.4, 0.1, 0.1, 0.2, 0.2], Krum(1))
    # α over rows 0-3 renormalised by 0.8: (0·0.4 + 1·0.1 + 2·0.1 + 3·0.2)/0.8 = 1.125
    assert got.tolist() == pytest.approx([1.125])


def test_krum_distances_are_float64() -> None:
    # Rows differing by 1e-4 around 1e4: float32 squares of the difference would still work,
    # but the float64 path must see the ordering of distances exactly.
    base = 10000.0
    s = torch.tensor([[base], [base + 0.001], [base + 0.002], [base + 0.003], [base + 1.0]],
                     dtype=torch.float32)
    got = robust_blend_rows(s, [0.2] * 5, Krum(1))
    assert abs(float(got[0]) - (base + 0.0015)) < 1e-2


@pytest.mark.parametrize("rule", [Median(), Trimmed(0.2), Clipped(0.5), Krum(1)],
                         ids=str)
def test_block_wise_in_place_equals_whole_stack(rule: RobustRule) -> None:
    g = torch.Generator().manual_seed(3)
    models = [{"w": torch.randn(7, 5, generator=g), "b": torch.randn(11, generator=g),
               "steps": torch.tensor(4)} for _ in range(6)]
    alpha = [0.3, 0.2, 0.1, 0.1, 0.2, 0.1]
    stack = torch.stack([torch.cat([m["w"].reshape(-1), m["b"]]) for m in models])
    want = robust_blend_rows(stack, alpha, rule)
    own = models[0]
    robust_blend_into(own, models, alpha, rule, block=4)  # blocks cut across tensors
    got = torch.cat([own["w"].reshape(-1), own["b"]])
    assert torch.allclose(got, want, atol=1e-6)
    assert int(own["steps"]) == 4  # non-floating tensors are left alone


def test_parse() -> None:
    assert parse_blend("weighted") is BlendPolicy.WEIGHTED
    assert parse_rule("median") == Median()
    assert parse_rule("trimmed") == Trimmed(0.1)
    assert parse_rule("trimmed:0.2") == Trimmed(0.2)
    assert parse_rule("clipped:2.0") == Clipped(2.0)
    assert parse_rule("krum") == Krum(1)
    assert parse_rule("krum:0") == Krum(0)
    for bad, msg in [("krum:1.5", "integer f >= 0"), ("krum:-1", "integer f >= 0"),
                     ("trimmed:0.5", r"\[0, 0.5\)"), ("clipped:0", "> 0"),
                     ("clipped:nan", "> 0"), ("median:1", "no parameter"),
                     ("mean", "unknown blend rule"), ("clipped:x", "not a number")]:
        with pytest.raises(ValueError, match=msg):
            parse_blend(bad)
    assert str(parse_rule("clipped:2")) == "clipped:2"
    assert math.isclose(parse_rule("trimmed:0.25").beta, 0.25)  # type: ignore[union-attr]


class _RobustRecorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def blend(self, plans: object) -> None:
        self.calls.append(("blend", None))

    def blend_robust(self, plans: object, rule: object) -> None:
        self.calls.append(("blend_robust", rule))

    def train(self, anchors: object) -> str:
        self.calls.append(("train", None))
        return "trained"


def test_the_one_round_hands_a_robust_rule_to_blend_robust() -> None:
    me = RoundAgent(meta("a", 5), (item("b", 4), item("c", 4)))
    ops = _RobustRecorder()
    out = cached_dfl_round([me], clock=Clock.rounds(5), policy=AlphaPolicy.parse("uniform"),
                           rho=0.0, ops=ops, blend=Krum(0))
    assert ops.calls == [("blend_robust", Krum(0)), ("train", None)]
    assert out.plans[0].origins == ("a", "b", "c")
    ops = _RobustRecorder()
    cached_dfl_round([me], clock=Clock.rounds(5), policy=AlphaPolicy.parse("uniform"),
                     rho=0.0, ops=ops)
    assert ops.calls[0] == ("blend", None)  # weighted: unchanged

    class Plain:
        def blend(self, plans: object) -> None: ...

        def train(self, anchors: object) -> str:
            return ""

    with pytest.raises(TypeError, match="needs RobustBlendOps"):
        cached_dfl_round([me], clock=Clock.rounds(5), policy=AlphaPolicy.parse("uniform"),
                         rho=0.0, ops=Plain(), blend=Median())
