"""The proximal helper a python learner adds to its own loop (peerd.learn.learner.proximal)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from peerd.core.local_update import local_update
from peerd.learn.learner.proximal import Proximal, ProximalError


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g)


def _anchor(model: nn.Module, shift: float) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() + shift for k, v in model.state_dict().items()}


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_the_term_and_the_gradient_hook_give_the_same_gradient() -> None:
    X, y = _data()
    a, b = _net(), _net()
    anchor = _anchor(a, 0.3)
    loss_fn = nn.CrossEntropyLoss()
    (loss_fn(a(X), y) + Proximal(a, anchor, 0.7).term()).backward()
    loss_fn(b(X), y).backward()
    Proximal(b, anchor, 0.7).add_grad()
    for ga, gb in zip(_grads(a), _grads(b), strict=True):
        torch.testing.assert_close(ga, gb)


def test_the_gradient_is_rho_times_the_distance_to_the_anchor() -> None:
    model = _net()
    anchor = _anchor(model, 0.5)
    Proximal(model, anchor, 2.0).term().backward()  # type: ignore[no-untyped-call]
    for name, p in model.named_parameters():
        assert p.grad is not None
        torch.testing.assert_close(p.grad, 2.0 * (p.detach() - anchor[name]))


def test_with_sgd_it_is_the_builtin_proximal_step() -> None:
    # The built-in learner's step is x ← x − η(∇f + ρ(x − x̄)): the helper with plain SGD in
    # a user's loop must land on the same parameters (same batches, same order).
    X, y = _data()
    ref, mine = nn.Linear(6, 3), nn.Linear(6, 3)
    mine.load_state_dict(ref.state_dict())
    anchor = _anchor(ref, 0.2)
    gen = torch.Generator().manual_seed(5)
    local_update(ref, X, y, steps=1, batch_size=32, lr=0.1, rho=0.5, loss="cross_entropy",
                 generator=gen, anchor=anchor)
    opt = torch.optim.SGD(mine.parameters(), lr=0.1)
    idx = torch.randperm(32, generator=torch.Generator().manual_seed(5))
    nn.functional.cross_entropy(mine(X[idx]), y[idx]).backward()  # type: ignore[no-untyped-call]
    Proximal(mine, anchor, 0.5).add_grad()
    opt.step()
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(mine.state_dict()[k], v)


def test_a_large_rho_keeps_adamw_at_the_anchor_and_rho_zero_does_not() -> None:
    X, y = _data()

    def train(rho: float) -> float:
        model = _net()
        anchor = _anchor(model, 0.0)
        prox = Proximal(model, anchor, rho)
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        for _ in range(30):
            opt.zero_grad()
            (nn.functional.cross_entropy(model(X), y) + prox.term()).backward()  # type: ignore[no-untyped-call]
            opt.step()
        return float(sum(float(((p.detach() - anchor[n]) ** 2).sum())
                         for n, p in model.named_parameters()) ** 0.5)

    assert train(1000.0) < 0.2 * train(0.0)


def test_rho_zero_adds_nothing_and_needs_no_anchor() -> None:
    model = _net()
    prox = Proximal(model, {}, 0.0)
    assert float(prox.term()) == 0.0
    prox.add_grad()
    assert all(p.grad is None for p in model.parameters())


def test_buffers_are_not_pulled_and_missing_parameters_are_named() -> None:
    model = _net()
    params_only = {n: p.detach().clone() for n, p in model.named_parameters()}
    Proximal(model, params_only, 1.0)  # no running_mean/var needed
    del params_only["3.weight"]
    with pytest.raises(ProximalError, match=r"3\.weight"):
        Proximal(model, params_only, 1.0)
    with pytest.raises(ProximalError, match="shape"):
        Proximal(model, {**params_only, "3.weight": torch.zeros(1)}, 1.0)
    with pytest.raises(ProximalError, match="rho"):
        Proximal(model, params_only, -1.0)
