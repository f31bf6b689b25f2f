"""Distillation as a local policy: the KL by hand, CE-only rows, β = 0 is plain training bit
for bit, and the one round function running knowledge mode (blend none + distillation)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest
import torch
from torch import nn

from peerd.core.alpha import AlphaPolicy
from peerd.core.distill import (
    Distillation,
    batched_distill_update,
    distill_local_update,
    distill_loss,
    eq18_kl_rows,
    kl_rows,
)
from peerd.core.local_update import batched_local_update, local_update, sample_batches
from peerd.core.plan import BlendPlan
from peerd.core.round import (
    PLAIN,
    Anchor,
    BlendPolicy,
    RoundAgent,
    cached_dfl_round,
)
from peerd.core.staleness import Clock
from tests.core.helpers import PlainOps, item, meta


def test_kl_by_hand() -> None:
    # Teacher logits (ln 3, 0) at T = 1: p_t = (3/4, 1/4); student (0, 0): p_s = (1/2, 1/2).
    # KL(p_t ‖ p_s) = 3/4 ln(3/2) + 1/4 ln(1/2) = 0.1308120...
    student = torch.tensor([[0.0, 0.0]])
    teacher = torch.tensor([[math.log(3.0), 0.0]])
    expected = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert kl_rows(student, teacher, 1.0).item() == pytest.approx(expected, abs=1e-6)
    # T = 2: p_t = (√3, 1)/(1 + √3); the T² factor multiplies by 4.
    s3 = math.sqrt(3.0)
    pt = (s3 / (1 + s3), 1 / (1 + s3))
    by_hand = 4 * (pt[0] * math.log(pt[0] / 0.5) + pt[1] * math.log(pt[1] / 0.5))
    assert kl_rows(student, teacher, 2.0).item() == pytest.approx(by_hand, abs=1e-6)
    # Direction: KL(teacher ‖ student), not the reverse (which is 0.1438410...).
    reverse = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    assert abs(kl_rows(student, teacher, 1.0).item() - reverse) > 1e-3


def test_equal_distributions_have_zero_kl() -> None:
    z = torch.tensor([[1.0, -2.0, 0.5]])
    assert kl_rows(z, z + 7.0, 3.0).item() == pytest.approx(0.0, abs=1e-6)


def test_rows_without_a_teacher_contribute_cross_entropy_only() -> None:
    student = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    target = torch.tensor([0, 1])
    teacher = torch.tensor([[0.0, 5.0], [9.0, 0.0]])
    policy = Distillation(beta=1.5, temperature=1.0, form="code")
    ce = nn.functional.cross_entropy(student, target)
    none = distill_loss(student, target, teacher, torch.tensor([False, False]), policy)
    assert torch.equal(none, ce)
    one = distill_loss(student, target, teacher, torch.tensor([True, False]), policy)
    kl0 = kl_rows(student[:1], teacher[:1], 1.0)[0]
    assert one.item() == pytest.approx((ce + 1.5 * kl0 / 2).item(), rel=1e-6)


def test_eq18_by_hand() -> None:
    # Student (ln 3, 0), teacher (0, 0), label 1, T = 2: τ(f) = (√3, 1)/(1 + √3), τ(z̄) = ½.
    # CE(τ(f), 1) = −ln(1/(1 + √3)); KL(τ(f) ‖ τ(z̄)) = Σ τ(f) ln(2 τ(f)); no T² factor.
    student = torch.tensor([[math.log(3.0), 0.0]])
    teacher = torch.zeros(1, 2)
    s3 = math.sqrt(3.0)
    p = (s3 / (1 + s3), 1 / (1 + s3))
    ce = -math.log(p[1])
    kl = p[0] * math.log(2 * p[0]) + p[1] * math.log(2 * p[1])
    assert eq18_kl_rows(student, teacher, 2.0).item() == pytest.approx(kl, abs=1e-6)
    policy = Distillation(beta=1.5, temperature=2.0, form="eq18")
    got = distill_loss(student, torch.tensor([1]), teacher, torch.tensor([True]), policy)
    assert got.item() == pytest.approx(ce + 1.5 * kl, abs=1e-6)
    # The code form of the same row: CE at T = 1 plus 4 · KL(τ(z̄) ‖ τ(f)).
    code = Distillation(beta=1.5, temperature=2.0, form="code")
    other = distill_loss(student, torch.tensor([1]), teacher, torch.tensor([True]), code)
    reverse = 0.5 * math.log(0.5 / p[0]) + 0.5 * math.log(0.5 / p[1])
    assert other.item() == pytest.approx(math.log(4.0) + 1.5 * 4 * reverse, abs=1e-6)
    # A row without a teacher: eq. 18's CE term only, at temperature T.
    alone = distill_loss(student, torch.tensor([1]), teacher, torch.tensor([False]), policy)
    assert alone.item() == pytest.approx(ce, abs=1e-6)


def test_the_two_forms_have_different_gradients() -> None:
    g = torch.Generator().manual_seed(3)
    student = (4 * torch.randn(16, 10, generator=g)).requires_grad_()
    teacher = 4 * torch.randn(16, 10, generator=g)
    target = torch.randint(0, 10, (16,), generator=g)
    has = torch.ones(16, dtype=torch.bool)
    grads = []
    for form in ("eq18", "code"):
        policy = Distillation(beta=1.5, temperature=3.0, form=form)
        (grad,) = torch.autograd.grad(distill_loss(student, target, teacher, has, policy),
                                      student)
        grads.append(grad.flatten())
    cos = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0).item()
    assert cos < 0.95
    assert not torch.allclose(grads[0], grads[1], rtol=0.1, atol=1e-4)


def test_unknown_form_is_refused() -> None:
    with pytest.raises(ValueError, match="form must be"):
        Distillation(form="hinton")  # type: ignore[arg-type]


def test_the_temperature_follows_the_form_unless_set() -> None:
    # eq. 18 is the default at T = 1; the code's loss keeps the code's T = 3; a T set stays.
    assert (Distillation().form, Distillation().t) == ("eq18", 1.0)
    assert Distillation(form="code").t == 3.0
    assert replace(Distillation(), form="code").t == 3.0  # unset stays unset: the form's
    assert Distillation(form="code", temperature=1.0).t == 1.0
    assert Distillation(form="eq18", temperature=3.0).t == 3.0
    # The default T is the one the loss uses: eq18 at T = 1 is CE + β·KL(softmax(f) ‖ ...).
    student, teacher = torch.randn(6, 4), torch.randn(6, 4)
    target, has = torch.randint(0, 4, (6,)), torch.ones(6, dtype=torch.bool)
    one = Distillation(beta=1.5, temperature=1.0)
    assert torch.equal(distill_loss(student, target, teacher, has, Distillation(beta=1.5)),
                       distill_loss(student, target, teacher, has, one))
    with pytest.raises(ValueError, match="temperature"):
        Distillation(temperature=0.0)


def data(n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)


def net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # tests may use the global RNG; peerd.core may not
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))


@pytest.mark.parametrize("form", ["eq18", "code"])
def test_beta_zero_is_plain_cross_entropy_training_bit_for_bit(form: str) -> None:
    X, y = data()
    teacher = torch.randn(40, 3)
    counts = torch.full((40,), 4)
    a, b = net(), net()
    policy = Distillation(beta=0.0, form=form)  # type: ignore[arg-type]
    distill_local_update(a, X, y, teacher, counts, steps=7, batch_size=8, lr=0.05,
                         policy=policy, generator=torch.Generator().manual_seed(1))
    local_update(b, X, y, steps=7, batch_size=8, lr=0.05, rho=0.0, loss="cross_entropy",
                 generator=torch.Generator().manual_seed(1))
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_teacher_changes_training_and_pulls_towards_it() -> None:
    X, y = data()
    teacher = torch.zeros(40, 3)
    teacher[:, 2] = 6.0  # every teacher says class 2
    counts = torch.full((40,), 16)
    a, b = net(), net()
    policy = Distillation(beta=5.0, temperature=1.0)
    distill_local_update(a, X, y, teacher, counts, steps=30, batch_size=8, lr=0.1,
                         policy=policy, generator=torch.Generator().manual_seed(1))
    distill_local_update(b, X, y, teacher, torch.zeros(40, dtype=torch.long), steps=30,
                         batch_size=8, lr=0.1, policy=policy,
                         generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        share_a = torch.softmax(a(X), dim=1)[:, 2].mean()
        share_b = torch.softmax(b(X), dim=1)[:, 2].mean()
    assert share_a > share_b + 0.1  # counts 0: no teacher, so b never saw it


def test_teachers_of_the_wrong_shape_are_refused() -> None:
    X, y = data()
    with pytest.raises(ValueError, match="teacher"):
        distill_local_update(net(), X, y, torch.zeros(39, 3), torch.zeros(40), steps=1,
                             batch_size=8, lr=0.1, policy=Distillation(),
                             generator=torch.Generator())
    with pytest.raises(ValueError, match="NaN"):
        distill_local_update(net(), X, y, torch.full((40, 3), math.nan), torch.zeros(40),
                             steps=1, batch_size=8, lr=0.1, policy=Distillation(),
                             generator=torch.Generator())


@pytest.mark.parametrize("kwargs", [{"beta": -1.0}, {"beta": math.inf},
                                    {"temperature": 0.0}, {"r": 0}])
def test_bad_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        Distillation(**kwargs)  # type: ignore[arg-type]


def _stacked(agents: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    models = [net(seed) for seed in range(agents)]
    names = [n for n, _ in models[0].named_parameters()]
    stack = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in models])
             for n in names}
    return models[0], stack


def test_batched_beta_zero_equals_the_batched_local_update_bit_for_bit() -> None:
    X, y = data()
    model, stack = _stacked(3)
    idx = torch.stack([sample_batches(40, 8, 5, torch.Generator().manual_seed(a))
                       for a in range(3)], dim=1)  # [K, A, B]
    teacher = torch.randn(40, 3)
    a, la = batched_distill_update(model, stack, X[idx], y[idx], teacher[idx],
                                   torch.ones(idx.shape, dtype=torch.bool), lr=0.05,
                                   policy=Distillation(beta=0.0))
    b, lb = batched_local_update(model, stack, X[idx], y[idx], lr=0.05, rho=0.0,
                                 loss="cross_entropy")
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert torch.equal(la, lb)


@pytest.mark.parametrize("form", ["eq18", "code"])
def test_batched_distillation_matches_one_model_at_a_time(form: str) -> None:
    X, y = data()
    model, stack = _stacked(2)
    gens = [torch.Generator().manual_seed(a) for a in range(2)]
    idx = torch.stack([sample_batches(40, 8, 4, g) for g in gens], dim=1)
    teacher = torch.randn(40, 3)
    counts = torch.randint(0, 3, (40,))
    policy = Distillation(beta=1.5, form=form)  # type: ignore[arg-type]
    out, _ = batched_distill_update(model, stack, X[idx], y[idx], teacher[idx],
                                    (counts > 0)[idx], lr=0.05, policy=policy)
    for a in range(2):
        single = net(a)
        distill_local_update(single, X, y, teacher, counts, steps=4, batch_size=8, lr=0.05,
                             policy=policy, generator=torch.Generator().manual_seed(a))
        for n, p in single.named_parameters():
            torch.testing.assert_close(out[n][a], p.detach(), rtol=1e-5, atol=1e-6)


def test_each_agent_takes_its_own_step_count() -> None:
    X, y = data()
    model, stack = _stacked(3)
    steps = [5, 2, 0]
    gens = [torch.Generator().manual_seed(a) for a in range(3)]
    idx = torch.stack([sample_batches(40, 8, 5, g) for g in gens], dim=1)
    teacher = torch.randn(40, 3)
    counts = torch.randint(0, 3, (40,))
    policy = Distillation(beta=1.5)
    out, loss = batched_distill_update(model, stack, X[idx], y[idx], teacher[idx],
                                       (counts > 0)[idx], lr=0.05, policy=policy,
                                       steps_per_agent=torch.tensor(steps))
    assert math.isnan(loss[2].item())
    assert not math.isnan(loss[1].item())
    for a in range(3):
        single = net(a)
        distill_local_update(single, X, y, teacher, counts, steps=steps[a], batch_size=8,
                             lr=0.05, policy=policy, generator=torch.Generator().manual_seed(a))
        for n, p in single.named_parameters():
            torch.testing.assert_close(out[n][a], p.detach(), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ the one round function


@dataclass
class KnowledgeRecorder:
    calls: list[str] = field(default_factory=list)
    policy: Distillation | None = None
    anchors: tuple[Anchor, ...] = ()

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        self.calls.append("blend")

    def train(self, anchors: Sequence[Anchor]) -> str:
        self.calls.append("train")
        return "trained"

    def distill(self, anchors: Sequence[Anchor], policy: Distillation) -> str:
        self.calls.append("distill")
        self.policy = policy
        self.anchors = tuple(anchors)
        return "distilled"


def _agents() -> list[RoundAgent]:
    return [RoundAgent(meta("a", 5), (item("b", 4), item("c", 3))),
            RoundAgent(meta("b", 4), (item("a", 5),))]


def test_knowledge_mode_blends_nothing_and_distils() -> None:
    ops = KnowledgeRecorder()
    policy = Distillation(beta=1.5, r=4)
    out = cached_dfl_round(_agents(), clock=Clock.rounds(5), policy=AlphaPolicy.parse("uniform"),
                           rho=0.0, ops=ops, blend=BlendPolicy.NONE, local=policy)
    assert ops.calls == ["distill"]
    assert ops.policy is policy
    assert [p.origins for p in out.plans] == [("a",), ("b",)]
    assert all(p.alone and p.alpha == (1.0,) for p in out.plans)
    assert out.trained == "distilled"
    assert out.publish == (True, True)
    assert ops.anchors == (Anchor.NONE, Anchor.NONE)


def test_weighted_blend_with_distillation_blends_then_distils() -> None:
    ops = KnowledgeRecorder()
    out = cached_dfl_round(_agents(), clock=Clock.rounds(5), policy=AlphaPolicy.parse("uniform"),
                           rho=0.0, ops=ops, local=Distillation())
    assert ops.calls == ["blend", "distill"]
    assert out.plans[0].origins == ("a", "b", "c")


def test_the_defaults_are_the_cached_dfl_round() -> None:
    ops = KnowledgeRecorder()
    out = cached_dfl_round(_agents(), clock=Clock.rounds(5), policy=AlphaPolicy.parse("uniform"),
                           rho=0.0, ops=ops, local=PLAIN)
    assert ops.calls == ["blend", "train"]
    assert out.trained == "trained"


def test_distillation_needs_knowledge_ops() -> None:
    ops = PlainOps()
    with pytest.raises(TypeError, match="KnowledgeOps"):
        cached_dfl_round(_agents(), clock=Clock.rounds(5), policy=AlphaPolicy.parse("uniform"),
                         rho=0.0, ops=ops, blend=BlendPolicy.NONE, local=Distillation())
    assert ops.calls == []
