"""Local update (§3.7–3.8): K proximal SGD steps; ρ = 0 is plain SGD exactly."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from peerd.core.drift import drift
from peerd.core.local_update import (
    GatheredBatches,
    batched_local_update,
    local_update,
    sample_batches,
    stacked_step_,
)


def data(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 5, generator=g)
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).long()
    return X, y


def net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2))


def params_of(m: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.named_parameters()}


def test_rho_zero_equals_plain_torch_sgd_bit_for_bit() -> None:
    X, y = data()
    a, b, c = net(), net(), net()
    local_update(a, X, y, steps=7, batch_size=16, lr=0.1, rho=0.0, loss="cross_entropy",
                 generator=torch.Generator().manual_seed(3))
    batches = sample_batches(len(X), 16, 7, torch.Generator().manual_seed(3))
    for idx in batches:
        b.zero_grad()
        loss = nn.functional.cross_entropy(b(X[idx]), y[idx])
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        with torch.no_grad():
            for p in b.parameters():
                assert p.grad is not None
                p.add_(p.grad, alpha=-0.1)  # x - ηg, the textbook step
    opt = torch.optim.SGD(c.parameters(), lr=0.1)  # the stock optimizer, default kernels
    for idx in batches:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(c(X[idx]), y[idx])
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        opt.step()
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(),
                                  strict=True):
        assert torch.equal(pa, pb), name
        assert torch.equal(pa, pc), name


class Tied(nn.Module):
    """One weight used twice per forward (as tied embeddings are)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.square = nn.Linear(5, 5)
        self.head = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.square(torch.tanh(self.square(x)))))  # type: ignore[no-any-return]


def test_tied_weight_is_stepped_once_with_its_summed_gradient() -> None:
    # The per-parameter step fires inside backward: a weight used twice must still be
    # stepped exactly once, with both uses' gradients, as torch.optim.SGD does.
    X, y = data()
    a, c = Tied(), Tied()
    local_update(a, X, y, steps=5, batch_size=16, lr=0.1, rho=0.0, loss="cross_entropy",
                 generator=torch.Generator().manual_seed(3))
    opt = torch.optim.SGD(c.parameters(), lr=0.1)
    for idx in sample_batches(len(X), 16, 5, torch.Generator().manual_seed(3)):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(c(X[idx]), y[idx])
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        opt.step()
    for pa, pc in zip(a.parameters(), c.parameters(), strict=True):
        torch.testing.assert_close(pa, pc, rtol=0, atol=1e-6)


def test_no_gradient_is_left_behind_and_stale_ones_are_ignored() -> None:
    X, y = data()
    a, b = net(), net()
    for p in a.parameters():
        p.grad = torch.full_like(p, 100.0)  # left over by the caller
    for m in (a, b):
        local_update(m, X, y, steps=3, batch_size=16, lr=0.1, rho=0.5, loss="cross_entropy",
                     generator=torch.Generator().manual_seed(1))
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert pa.grad is None
        assert torch.equal(pa, pb)
    # The hooks are gone: a plain backward afterwards just accumulates gradients.
    loss = nn.functional.cross_entropy(a(X), y)
    loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    assert all(p.grad is not None for p in a.parameters())


def test_penalty_gradient_is_rho_times_x_minus_anchor() -> None:
    X, y = data()
    m = net()
    anchor = {k: v + 0.5 for k, v in params_of(m).items()}  # x̄ ≠ x so the pull is visible
    ref = copy.deepcopy(m)
    lr, rho = 0.05, 2.0
    local_update(m, X, y, steps=1, batch_size=16, lr=lr, rho=rho, loss="cross_entropy",
                 generator=torch.Generator().manual_seed(1), anchor=anchor)
    idx = sample_batches(len(X), 16, 1, torch.Generator().manual_seed(1))[0]
    loss = nn.functional.cross_entropy(ref(X[idx]), y[idx])
    loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    for (name, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
        assert q.grad is not None
        expected = q.detach() - lr * (q.grad + rho * (q.detach() - anchor[name]))
        torch.testing.assert_close(p.detach(), expected, rtol=1e-6, atol=1e-7)


def test_huge_rho_keeps_the_local_update_at_the_anchor() -> None:
    X, y = data()
    start = net()
    anchor = params_of(start)
    free, leashed = copy.deepcopy(start), copy.deepcopy(start)
    kw = dict(steps=20, batch_size=16, lr=0.01, loss="cross_entropy")
    local_update(free, X, y, rho=0.0, generator=torch.Generator().manual_seed(0), **kw)  # type: ignore[arg-type]
    local_update(leashed, X, y, rho=100.0, generator=torch.Generator().manual_seed(0), **kw)  # type: ignore[arg-type]
    d_free = drift(params_of(free), anchor)
    d_leashed = drift(params_of(leashed), anchor)
    assert d_free > 0.05
    assert d_leashed < 0.1 * d_free


def test_training_reduces_the_task_loss() -> None:
    X, y = data(256)
    m = net()
    first = local_update(m, X, y, steps=1, batch_size=256, lr=0.5, rho=0.0,
                         loss="cross_entropy", generator=torch.Generator().manual_seed(0))
    local_update(m, X, y, steps=100, batch_size=32, lr=0.5, rho=0.0, loss="cross_entropy",
                 generator=torch.Generator().manual_seed(0))
    after = local_update(m, X, y, steps=1, batch_size=256, lr=1e-9, rho=0.0,
                         loss="cross_entropy", generator=torch.Generator().manual_seed(0))
    assert after.mean_loss < 0.5 * first.mean_loss


def test_mse_regression_loss_fits_a_line() -> None:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(128, 1, generator=g)
    y = 3.0 * X[:, 0] - 1.0
    torch.manual_seed(0)
    m = nn.Linear(1, 1)
    local_update(m, X, y, steps=300, batch_size=32, lr=0.1, rho=0.0, loss="mse", generator=g)
    assert m.weight.item() == pytest.approx(3.0, abs=1e-2)
    assert m.bias.item() == pytest.approx(-1.0, abs=1e-2)


def test_batches_come_from_the_current_data_which_may_grow() -> None:
    g = torch.Generator().manual_seed(0)
    small = sample_batches(10, 5, 4, g)
    assert small.shape == (4, 5)
    assert int(small.max()) < 10
    # one pass covers every row once before any repeats
    assert sorted(small[:2].reshape(-1).tolist()) == list(range(10))
    grown = sample_batches(30, 5, 6, g)
    assert sorted(grown.reshape(-1).tolist()) == list(range(30))


def test_batch_larger_than_data_is_clipped_and_empty_data_is_an_error() -> None:
    assert sample_batches(3, 64, 2, torch.Generator()).shape == (2, 3)
    with pytest.raises(ValueError, match="no local data"):
        sample_batches(0, 8, 1, torch.Generator())


def test_same_seed_same_model() -> None:
    X, y = data()
    a, b = net(), net()
    for m in (a, b):
        local_update(m, X, y, steps=5, batch_size=8, lr=0.1, rho=0.3, loss="cross_entropy",
                     generator=torch.Generator().manual_seed(42))
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


@pytest.mark.parametrize("rho", [0.0, 0.5])
def test_batched_update_matches_one_model_at_a_time(rho: float) -> None:
    agents, steps, bs = 3, 4, 8
    datasets = [data(32, seed=a) for a in range(agents)]
    starts = [net(seed=a) for a in range(agents)]
    template = net()
    stacked = {k: torch.stack([params_of(m)[k] for m in starts]) for k in params_of(template)}
    idx = [sample_batches(32, bs, steps, torch.Generator().manual_seed(a)) for a in range(agents)]
    Xb = torch.stack([torch.stack([datasets[a][0][idx[a][k]] for a in range(agents)])
                      for k in range(steps)])
    yb = torch.stack([torch.stack([datasets[a][1][idx[a][k]] for a in range(agents)])
                      for k in range(steps)])
    new, losses = batched_local_update(template, stacked, Xb, yb, lr=0.1, rho=rho,
                                       loss="cross_entropy")
    for a in range(agents):
        single = starts[a]
        res = local_update(single, *datasets[a], steps=steps, batch_size=bs, lr=0.1, rho=rho,
                           loss="cross_entropy", generator=torch.Generator().manual_seed(a))
        for name, p in single.named_parameters():
            torch.testing.assert_close(new[name][a], p.detach(), rtol=1e-5, atol=1e-6)
        assert float(losses[a]) == pytest.approx(res.mean_loss, rel=1e-5)


@pytest.mark.parametrize(("lr", "rho"), [(0.1, 0.01), (0.05, 0.5), (0.3, 2.0)])
def test_fused_stacked_step_equals_the_reference_formula(lr: float, rho: float) -> None:
    g = torch.Generator().manual_seed(7)
    shapes = [(50, 64, 784), (50, 64), (50, 10, 64), (50, 10)]
    xs = [torch.randn(s, generator=g) for s in shapes]
    grads = [torch.randn(s, generator=g) for s in shapes]
    anchors = [x + 0.1 * torch.randn(x.shape, generator=g) for x in xs]
    # The formula as the lecture writes it, in float64 so only the fused step rounds.
    want = [(x.double() - lr * (gr.double() + rho * (x.double() - a.double()))).float()
            for x, gr, a in zip(xs, grads, anchors, strict=True)]
    stacked_step_(xs, grads, anchors, lr=lr, rho=rho)
    for got, w in zip(xs, want, strict=True):
        torch.testing.assert_close(got, w, rtol=1.3e-6, atol=1e-6)


def test_fused_stacked_step_at_rho_zero_is_sgd_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(8)
    xs = [torch.randn(20, 33, generator=g), torch.randn(20, generator=g)]
    grads = [torch.randn(20, 33, generator=g), torch.randn(20, generator=g)]
    want = [x.clone().add_(gr, alpha=-0.1) for x, gr in zip(xs, grads, strict=True)]
    stacked_step_(xs, grads, None, lr=0.1, rho=0.0)
    assert all(torch.equal(a, b) for a, b in zip(xs, want, strict=True))
    # A gradient vmap hands back as an expanded view (stride 0) is only read.
    zero = torch.zeros(1, 33).expand(20, 33)
    before = xs[0].clone()
    stacked_step_([xs[0]], [zero], [before + 1], lr=0.1, rho=0.0)
    assert torch.equal(xs[0], before)


def test_batched_update_leaves_its_inputs_alone() -> None:
    X, y = data(32)
    template = net()
    stacked = {k: torch.stack([v, v + 0.1]) for k, v in params_of(template).items()}
    kept = {k: v.clone() for k, v in stacked.items()}
    idx = torch.stack([sample_batches(32, 8, 3, torch.Generator().manual_seed(a))
                       for a in range(2)], dim=1)
    new, _ = batched_local_update(template, stacked, X[idx], y[idx], lr=0.1, rho=0.5,
                                  loss="cross_entropy")
    assert all(torch.equal(stacked[k], kept[k]) for k in stacked)
    assert not any(torch.equal(new[k], kept[k]) for k in stacked)


def test_gathered_batches_equal_the_whole_gather_step_by_step() -> None:
    X, y = data(40)
    idx = torch.stack([sample_batches(40, 8, 4, torch.Generator().manual_seed(a))
                       for a in range(3)], dim=1)  # [K, A, B]
    whole = X[idx]
    lazy = GatheredBatches(X, idx)
    assert lazy.shape == whole.shape
    assert len(lazy) == 4
    for k in range(4):
        assert torch.equal(lazy[k], whole[k])
    template = net()
    stacked = {k: torch.stack([v, v - 0.2, v + 0.3]) for k, v in params_of(template).items()}
    a, la = batched_local_update(template, stacked, whole, y[idx], lr=0.1, rho=0.5,
                                 loss="cross_entropy")
    b, lb = batched_local_update(template, stacked, lazy, y[idx], lr=0.1, rho=0.5,
                                 loss="cross_entropy")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(la, lb)


def test_negative_rho_or_lr_is_refused() -> None:
    X, y = data()
    with pytest.raises(ValueError, match="need rho >= 0"):
        local_update(net(), X, y, steps=1, batch_size=8, lr=0.1, rho=-1.0,
                     loss="cross_entropy", generator=torch.Generator())
    with pytest.raises(ValueError, match="unknown loss 'hinge'"):
        local_update(net(), X, y, steps=1, batch_size=8, lr=0.1, rho=0.0,
                     loss="hinge", generator=torch.Generator())  # type: ignore[arg-type]


def test_given_batches_replace_the_sampler_and_draw_nothing() -> None:
    # The sampler's own draws passed in as batches: the same training, bit for bit, and the
    # generator handed over alongside them is left untouched.
    X, y = data()
    a, b = net(), net()
    ra = local_update(a, X, y, steps=6, batch_size=16, lr=0.1, rho=0.3, loss="cross_entropy",
                      generator=torch.Generator().manual_seed(3))
    drawn = list(sample_batches(len(X), 16, 6, torch.Generator().manual_seed(3)))
    g = torch.Generator().manual_seed(11)
    state = g.get_state()
    rb = local_update(b, X, y, steps=6, batch_size=999, lr=0.1, rho=0.3, loss="cross_entropy",
                      generator=g, batches=drawn)
    assert torch.equal(g.get_state(), state)
    assert (ra.mean_loss, ra.last_loss) == (rb.mean_loss, rb.last_loss)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    # Their order is the order of the steps: reversed, they train a different model.
    c = net()
    local_update(c, X, y, steps=6, batch_size=16, lr=0.1, rho=0.3, loss="cross_entropy",
                 generator=torch.Generator(), batches=drawn[::-1])
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(),
                                                          strict=True))
    with pytest.raises(ValueError, match="5 batches for 6 steps"):
        local_update(net(), X, y, steps=6, batch_size=16, lr=0.1, rho=0.0,
                     loss="cross_entropy", generator=torch.Generator(), batches=drawn[:5])
