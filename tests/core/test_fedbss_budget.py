"""FedBSS's step budget (``curriculum_update(steps=K)``): exactly K SGD steps per round, spread
over the E epochs like full epochs would be, drawn from each epoch's admitted samples."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from peerd.core.drift import drift
from peerd.core.fedbss import (
    FedBSS,
    WarmupState,
    budget_per_epoch,
    budget_positions,
    curriculum_update,
    epoch_indices,
    fedbss_local_update,
    peak_split,
    score_samples,
)


def test_budget_follows_the_admitted_counts_and_sums_to_k() -> None:
    assert budget_per_epoch([1, 1, 2], 4) == [1, 1, 2]
    assert budget_per_epoch([10, 10, 10, 10], 2) == [1, 0, 1, 0]  # 0.5 -> 1, 1.5 -> 2, half-up
    assert budget_per_epoch([5, 0, 5], 3) == [2, 0, 1]  # 1.5 -> 2, then 3
    assert budget_per_epoch([0, 0], 5) == [0, 0]
    for counts in ([3, 4, 9, 20, 31], [1] * 10, [7, 100]):
        for k in (0, 1, 5, 10, 33):
            b = budget_per_epoch(counts, k)
            assert sum(b) == k
            assert min(b) >= 0
    with pytest.raises(ValueError, match=">= 0"):
        budget_per_epoch([1, 2], -1)


def test_positions_subsample_the_epoch_in_rank_order() -> None:
    g = torch.Generator().manual_seed(0)
    batches = budget_positions(10, 2, 3, g)
    assert [b.shape[0] for b in batches] == [3, 3]
    flat = torch.cat(batches)
    assert len(set(flat.tolist())) == 6  # without replacement
    assert torch.equal(flat, torch.sort(flat).values)  # easy to hard
    assert int(flat.min()) >= 0
    assert int(flat.max()) < 10
    # A pool smaller than the budget: whole passes in rank order, batches no bigger than it.
    assert [b.tolist() for b in budget_positions(2, 3, 4, g)] == [[0, 1]] * 3
    assert [b.tolist() for b in budget_positions(3, 2, 2, g)][:1] == [[0, 1]]
    assert budget_positions(0, 3, 4, g) == []
    assert budget_positions(5, 0, 4, g) == []


def _setup() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(60, 5, generator=g), torch.randint(0, 3, (60,), generator=g)
    m = nn.Linear(5, 3)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return m, X, y


@pytest.mark.parametrize("k", [1, 4, 7, 50])
def test_a_budget_takes_exactly_k_steps(k: int) -> None:
    model, X, y = _setup()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    r = curriculum_update(model, X, y, batch_size=8, lr=0.1, rho=0.0,
                          policy=FedBSS(warmup_rounds=0, epochs=4),
                          generator=torch.Generator().manual_seed(0), steps=k)
    assert r.steps == k
    assert drift(before, {n: p.detach() for n, p in model.named_parameters()}) > 0


def test_a_budget_of_one_step_trains_on_the_first_epochs_admitted_samples_only() -> None:
    # E = 4, K = 1: the step goes to the epoch where the cumulative count crosses half, and
    # its batch comes from that epoch's pool; a batch over the whole pool reproduces it.
    model, X, y = _setup()
    ref, _, _ = _setup()
    policy = FedBSS(warmup_rounds=0, epochs=4)
    s = score_samples(model, X, y)
    split = peak_split(s.loss, s.uncertainty)
    pools = [epoch_indices(split, e, 4) for e in range(1, 5)]
    budget = budget_per_epoch([int(p.shape[0]) for p in pools], 1)
    e = budget.index(1)
    big = int(pools[e].shape[0])  # batch = the whole pool: no sampling left to chance
    curriculum_update(model, X, y, batch_size=big, lr=0.1, rho=0.0, policy=policy,
                      generator=torch.Generator().manual_seed(0), steps=1)
    loss = nn.functional.cross_entropy(ref(X[pools[e]]), y[pools[e]])
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    with torch.no_grad():
        for p, grad in zip(ref.parameters(), grads, strict=True):
            p.sub_(0.1 * grad)
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_negative_budget_is_refused() -> None:
    model, X, y = _setup()
    with pytest.raises(ValueError, match="steps"):
        curriculum_update(model, X, y, batch_size=8, lr=0.1, rho=0.0, policy=FedBSS(0, 2),
                          generator=torch.Generator().manual_seed(0), steps=-1)


def test_the_policy_budget_reaches_the_daemons_curriculum_rounds() -> None:
    # fedbss_local_update (the daemon's path, [learning] fedbss_steps) passes the policy's
    # step budget on: a curriculum round takes exactly that many steps, 0 = full epochs.
    state = WarmupState()
    counts = []
    for budget in (6, 0):
        model, X, y = _setup()
        result, _, curriculum = fedbss_local_update(
            model, X, y, state=state, policy=FedBSS(warmup_rounds=0, epochs=4,
                                                   step_budget=budget),
            steps=10, batch_size=8, lr=0.1, rho=0.0, loss="cross_entropy",
            generator=torch.Generator().manual_seed(0))
        assert curriculum
        counts.append(result.steps)
    assert counts[0] == 6
    assert counts[1] > 6  # 4 full epochs of 8-sample batches over the admitted samples
    with pytest.raises(ValueError, match="step_budget"):
        FedBSS(step_budget=-1)
