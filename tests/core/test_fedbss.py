"""FedBSS (seed ``fedbss-fedcvt-lecture.txt`` §16.2–16.5): every worked number of the lecture,
the peak split, the cosine gate, warm-up (bit for bit plain training) and re-warm-up, and the
one round function dispatching the policy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

from peerd.core.alpha import AlphaPolicy
from peerd.core.drift import drift
from peerd.core.fedbss import (
    FedBSS,
    Split,
    WarmupState,
    admitted_reds,
    alpha,
    curriculum_update,
    epoch_indices,
    fedbss_local_update,
    next_round,
    peak_split,
    score_samples,
    scores_from_probs,
)
from peerd.core.local_update import local_update
from peerd.core.plan import BlendPlan
from peerd.core.round import Anchor, RoundAgent, cached_dfl_round
from peerd.core.staleness import Clock
from tests.core.helpers import PlainOps, item, meta

# ------------------------------------------------------------------ §16.2 scores


def test_cat_photo_loss_spread_and_uncertainty() -> None:
    # §16.2: softmax 0.92 on cat (the true class), smallest mass 0.03.
    s = scores_from_probs(torch.tensor([[0.92, 0.05, 0.03]]), torch.tensor([0]))
    assert round(float(s.loss[0]), 2) == 0.08  # −ln(0.92) ≈ 0.08
    assert float(s.spread[0]) == pytest.approx(0.89)  # 0.92 − 0.03
    assert float(s.uncertainty[0]) == pytest.approx(0.11)  # 1 − 0.89


def test_confused_photo_loss() -> None:
    s = scores_from_probs(torch.tensor([[0.35, 0.33, 0.32]]), torch.tensor([0]))
    assert round(float(s.loss[0]), 2) == 1.05  # −ln(0.35) ≈ 1.05
    assert float(s.uncertainty[0]) == pytest.approx(1 - (0.35 - 0.32))  # flat: u near 1


def test_confident_and_wrong_has_low_uncertainty_but_huge_loss() -> None:
    # §16.3.3 zone 3: bird is true, softmax (0.03, 0.92, 0.05) on (bird, cat, dog).
    s = scores_from_probs(torch.tensor([[0.03, 0.92, 0.05]]), torch.tensor([0]))
    assert round(float(s.loss[0]), 2) == 3.51
    assert float(s.spread[0]) == pytest.approx(0.89)
    assert float(s.uncertainty[0]) == pytest.approx(0.11)


def test_scoring_pass_is_read_only_and_matches_the_softmax_numbers() -> None:
    g = torch.Generator().manual_seed(0)
    model = nn.Linear(4, 3)
    model.train()
    X, y = torch.randn(10, 4, generator=g), torch.randint(0, 3, (10,), generator=g)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    s = score_samples(model, X, y, batch_size=3)
    assert model.training
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    ref = scores_from_probs(torch.softmax(model(X).detach(), dim=-1), y)
    assert torch.allclose(s.loss, ref.loss, atol=1e-6)
    assert torch.allclose(s.uncertainty, ref.uncertainty, atol=1e-6)


# ------------------------------------------------------------------ §16.3 sort and peak split


def test_six_photo_demo_peaks_at_rank_four() -> None:
    # §16.3.1–16.3.2: S = (0.08, 0.16, 0.36, 1.05, 1.30, 3.00) and the loss-sorted
    # u = (0.11, 0.28, 0.60, 0.95, 0.72, 0.40): peak 0.95 at rank 4 → greens 1–4, reds 5–6.
    # The samples arrive out of order (capture order ≠ rank order).
    perm = [3, 0, 5, 1, 4, 2]  # sample i has rank perm[i]
    S = [0.08, 0.16, 0.36, 1.05, 1.30, 3.00]
    U = [0.11, 0.28, 0.60, 0.95, 0.72, 0.40]
    loss = torch.tensor([S[r] for r in perm])
    u = torch.tensor([U[r] for r in perm])
    split = peak_split(loss, u)
    assert split.greens == 4
    assert split.reds == 2
    assert loss[split.order].tolist() == pytest.approx(S)
    assert [perm[i] + 1 for i in split.order[:4].tolist()] == [1, 2, 3, 4]
    assert [perm[i] + 1 for i in split.order[4:].tolist()] == [5, 6]


def test_another_phone_cuts_at_its_own_peak() -> None:
    # "If another phone's list peaked at 0.70 on rank 2, that phone would cut in a different
    # place."
    split = peak_split(torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([0.2, 0.7, 0.5, 0.1]))
    assert split.greens == 2


def test_ties_in_loss_break_by_sample_index() -> None:
    split = peak_split(torch.tensor([0.5, 0.1, 0.5, 0.5]), torch.tensor([0.1, 0.2, 0.3, 0.9]))
    assert split.order.tolist() == [1, 0, 2, 3]


# ------------------------------------------------------------------ §16.4 cosine admission


def test_alpha_table_for_ten_epochs() -> None:
    # §16.4.2: epoch 1 ≈ 0.02, epoch 3 ≈ 0.21, epoch 4 = 34.55 %, epoch 6 ≈ 65 %, epoch 10 = 1;
    # §16.4.3: α(5) = 0.5 at the midpoint.
    assert round(alpha(1, 10), 2) == 0.02
    assert round(alpha(3, 10), 2) == 0.21
    assert round(alpha(4, 10) * 100, 2) == 34.55
    assert round(alpha(6, 10) * 100) == 65
    assert alpha(5, 10) == pytest.approx(0.5)
    assert alpha(10, 10) == 1.0
    assert alpha(0, 10) == 0.0
    values = [alpha(e, 10) for e in range(11)]
    assert values == sorted(values)


def test_counts_round_the_product() -> None:
    # §16.4.3: 34.55 % of six photos is 2.07, which rounds to 2; the spoken six-photo walk
    # (epochs 4, 5, 6, 7 → 2, 3, 4, 5) multiplies by six.
    assert round(6 * alpha(4, 10), 2) == 2.07
    assert admitted_reds(6, 4, 10) == 2
    assert [admitted_reds(6, e, 10) for e in (4, 5, 6, 7)] == [2, 3, 4, 5]
    # The class's correction multiplies the red count only: |R| = 3.
    assert [admitted_reds(3, e, 10) for e in range(11)] == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 3]
    # Half-up: 1 · α(5) = 0.5 → 1 (Python's banker's round(0.5) would give 0).
    assert admitted_reds(1, 5, 10) == 1
    with pytest.raises(ValueError, match="epoch"):
        alpha(11, 10)


def test_greens_always_in_reds_easiest_first() -> None:
    split = Split(torch.tensor([5, 2, 0, 4, 1, 3]), greens=4)  # reds: samples 1 then 3
    assert epoch_indices(split, 1, 10).tolist() == [5, 2, 0, 4]
    assert epoch_indices(split, 4, 10).tolist() == [5, 2, 0, 4, 1]  # round(2·0.3455) = 1
    assert epoch_indices(split, 10, 10).tolist() == [5, 2, 0, 4, 1, 3]  # all by the last


# ------------------------------------------------------------------ drift (§16.1.3, §16.2.5)


def test_drift_pairs() -> None:
    # η = 0.1 turns ∇L = 0.5 into drift 0.05 (3.0 → 3.05) and ∇L = 22 into 2.2 (3.0 → 0.8).
    w = torch.tensor([3.0], dtype=torch.float64)
    gentle = w - 0.1 * torch.tensor([-0.5], dtype=torch.float64)
    yanked = w - 0.1 * torch.tensor([22.0], dtype=torch.float64)
    assert float(gentle[0]) == pytest.approx(3.05)
    assert float(yanked[0]) == pytest.approx(0.8)
    assert drift({"w": w}, {"w": gentle}) == pytest.approx(0.05)
    assert drift({"w": w}, {"w": yanked}) == pytest.approx(2.2)
    # The two-weight toy: (3.0, 3.0) → (0.8, 1.1): √8.45 ≈ 2.91.
    v = {"w": torch.tensor([3.0, 3.0], dtype=torch.float64)}
    moved = {"w": torch.tensor([0.8, 1.1], dtype=torch.float64)}
    assert drift(v, moved) ** 2 == pytest.approx(8.45)
    assert round(drift(v, moved), 2) == 2.91


# ------------------------------------------------------------------ §16.5 warm-up


def test_warmup_then_curriculum_and_rewarmup_on_growth() -> None:
    policy = FedBSS(warmup_rounds=2, epochs=4, regrow_fraction=0.5)
    state = WarmupState()
    phases = []
    for size in (10, 12, 14, 15, 16, 24, 24, 24):
        curriculum, state = next_round(policy, state, size)
        phases.append(curriculum)
    # 10, 12: warm-up; 14, 15: curriculum (≤ 15 = 1.5 × 10); 16 > 15: warm-up again from 16,
    # 24 = 1.5 × 16 is not past the threshold: warm-up continues, then curriculum.
    assert phases == [False, False, True, True, False, False, True, True]
    assert state == WarmupState(2, 16)


def test_no_warmup_is_curriculum_from_the_first_round() -> None:
    curriculum, _ = next_round(FedBSS(warmup_rounds=0), WarmupState(), 5)
    assert curriculum


def _data(n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)


def _model() -> nn.Module:
    torch_gen = torch.Generator().manual_seed(2)
    m = nn.Linear(5, 3)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=torch_gen))
    return m


def test_warmup_rounds_are_plain_training_bit_for_bit() -> None:
    X, y = _data()
    policy = FedBSS(warmup_rounds=2, epochs=3)
    a, b = _model(), _model()
    ga, gb = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    state = WarmupState()
    for _ in range(2):
        ra, state, curriculum = fedbss_local_update(
            a, X, y, state=state, policy=policy, steps=5, batch_size=8, lr=0.1, rho=0.5,
            loss="cross_entropy", generator=ga)
        rb = local_update(b, X, y, steps=5, batch_size=8, lr=0.1, rho=0.5,
                          loss="cross_entropy", generator=gb)
        assert not curriculum
        assert ra == rb
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(pa, pb)
    # The third round is the curriculum: it no longer follows the plain path.
    ra, state, curriculum = fedbss_local_update(
        a, X, y, state=state, policy=policy, steps=5, batch_size=8, lr=0.1, rho=0.5,
        loss="cross_entropy", generator=ga)
    local_update(b, X, y, steps=5, batch_size=8, lr=0.1, rho=0.5, loss="cross_entropy",
                 generator=gb)
    assert curriculum
    assert not all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters(),
                                                         strict=True))


def test_curriculum_takes_one_step_per_batch_of_each_epochs_mix() -> None:
    X, y = _data()
    model = _model()
    policy = FedBSS(warmup_rounds=0, epochs=4)
    s = score_samples(model, X, y)
    split = peak_split(s.loss, s.uncertainty)
    expect = sum(-(-epoch_indices(split, e, 4).shape[0] // 8) for e in range(1, 5))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    r = curriculum_update(model, X, y, batch_size=8, lr=0.1, rho=0.0, policy=policy,
                          generator=torch.Generator().manual_seed(0))
    assert r.steps == expect
    assert math.isfinite(r.mean_loss)
    after = {n: p.detach() for n, p in model.named_parameters()}
    assert drift(before, after) > 0


def test_fedbss_needs_a_classification_loss_and_sane_parameters() -> None:
    X, y = _data()
    with pytest.raises(ValueError, match="cross_entropy"):
        fedbss_local_update(_model(), X, y.float(), state=WarmupState(), policy=FedBSS(),
                            steps=1, batch_size=4, lr=0.1, rho=0.0, loss="mse",
                            generator=torch.Generator())
    for bad in ({"warmup_rounds": -1}, {"epochs": 0}, {"regrow_fraction": -0.1},
                {"regrow_fraction": math.nan}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            FedBSS(**bad)


# ------------------------------------------------------------------ the one round function


@dataclass
class CurriculumRecorder:
    calls: list[str] = field(default_factory=list)
    policy: FedBSS | None = None

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        self.calls.append("blend")

    def train(self, anchors: Sequence[Anchor]) -> str:
        self.calls.append("train")
        return "trained"

    def curriculum(self, anchors: Sequence[Anchor], policy: FedBSS) -> str:
        self.calls.append("curriculum")
        self.policy = policy
        return "curriculum"


def _agents() -> list[RoundAgent]:
    return [RoundAgent(meta("a", 5), (item("b", 4),))]


def test_round_blends_then_runs_the_curriculum() -> None:
    ops = CurriculumRecorder()
    policy = FedBSS(warmup_rounds=3)
    out = cached_dfl_round(_agents(), clock=Clock.rounds(5), policy=AlphaPolicy.parse("uniform"),
                           rho=0.0, ops=ops, local=policy)
    assert ops.calls == ["blend", "curriculum"]
    assert ops.policy is policy
    assert out.trained == "curriculum"


def test_fedbss_needs_curriculum_ops() -> None:
    ops = PlainOps()
    with pytest.raises(TypeError, match="CurriculumOps"):
        cached_dfl_round(_agents(), clock=Clock.rounds(5), policy=AlphaPolicy.parse("uniform"),
                         rho=0.0, ops=ops, local=FedBSS())


def test_drift_leaves_float64_inputs_untouched() -> None:
    # Found by test_drift_pairs: flat_distance's .double() of a float64 tensor is the tensor
    # itself, and its in-place subtraction overwrote the caller's weights.
    w = {"w": torch.tensor([3.0], dtype=torch.float64)}
    drift(w, {"w": torch.tensor([3.05], dtype=torch.float64)})
    assert w["w"].tolist() == [3.0]
