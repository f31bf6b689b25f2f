"""The stacked forward passes (peerd.sim.stacked) compute exactly what the models compute."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

from peerd.core.entry import flatten
from peerd.core.local_update import LossName, batched_local_update
from peerd.learn.models import build_model
from peerd.sim.stacked import fused_step, stacked_forward
from peerd.sim.train import draw_batches, model_schema, train_batched, train_loop

SHAPES = {"cnn": (1, 28, 28), "mlp": (1, 28, 28), "linear": (16,), "medium": (16,)}


def _stacked(model: nn.Module, agents: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {n: (p.detach().unsqueeze(0) + 0.05 * torch.randn(agents, *p.shape, generator=g))
            .to(dtype) for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_stacked_forward_equals_each_agents_own_forward_in_float64(kind: str) -> None:
    model = build_model(kind, SHAPES[kind], 10, seed=0).double()
    forward = stacked_forward(model)
    assert forward is not None
    params = _stacked(model, 3, torch.float64)
    x = torch.rand(3, 5, *SHAPES[kind], generator=torch.Generator().manual_seed(2),
                   dtype=torch.float64) - 0.5
    got = forward(params, x)
    for a in range(3):
        want = functional_call(model, {n: v[a] for n, v in params.items()}, (x[a],))
        torch.testing.assert_close(got[a], want, rtol=1e-12, atol=1e-12)


def test_other_architectures_get_none_and_keep_vmap() -> None:
    assert stacked_forward(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten())) is None
    assert stacked_forward(nn.Sequential(nn.Linear(3, 2))) is None  # not one of peerd's models


def _fleet(kind: str, agents: int, dtype: torch.dtype, classes: int = 10) -> tuple[
        nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, list[np.ndarray]]:
    model = build_model(kind, SHAPES[kind], classes, seed=0).to(dtype)
    schema = model_schema(model)
    init = flatten(dict(model.named_parameters()), schema)
    g = torch.Generator().manual_seed(3)
    matrix = init + 0.01 * torch.randn(agents, init.numel(), generator=g, dtype=dtype)
    x = torch.rand(40 * agents, *SHAPES[kind], generator=g, dtype=dtype)
    y = torch.randint(0, classes, (40 * agents,), generator=g)
    idx = [np.arange(40 * a, 40 * a + 40) for a in range(agents)]
    return model, matrix, x, y, idx


def _both(kind: str, dtype: torch.dtype, rho: float, loss: LossName = "cross_entropy",
          classes: int = 10) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                      torch.Tensor]:
    model, matrix, x, y, idx = _fleet(kind, 3, dtype, classes)
    target: torch.Tensor = y.to(dtype) if loss == "mse" else y
    schema = model_schema(model)
    batches = draw_batches(idx, 3, 16, seed=1, round_index=0)
    fast, fast_loss = train_batched(model, matrix, schema, x, target, batches, lr=0.1, rho=rho,
                                    loss=loss)
    slow, slow_loss = train_loop(model, matrix, schema, x, target, idx, steps=3, batch_size=16,
                                 lr=0.1, rho=rho, seed=1, round_index=0, loss=loss)
    return matrix, fast, slow, fast_loss, slow_loss


@pytest.mark.parametrize("rho", [0.0, 0.5])
@pytest.mark.parametrize("kind", ["cnn", "mlp"])
def test_batched_steps_equal_the_per_agent_loop_in_float64(kind: str, rho: float) -> None:
    matrix, fast, slow, fast_loss, slow_loss = _both(kind, torch.float64, rho)
    assert not torch.allclose(fast, matrix)  # it did train
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(fast_loss, slow_loss, rtol=1e-6, atol=1e-7)  # losses are float32


def test_batched_cnn_steps_match_the_loop_in_float32_with_the_proximal_pull() -> None:
    # float32: the first conv's weight gradient sums ~18k products per weight in an order
    # the loop's oneDNN call does not share; both sit ~1e-3 (relative) from float64 there.
    matrix, fast, slow, fast_loss, slow_loss = _both("cnn", torch.float32, 0.01)
    step = (slow - matrix).abs().max()
    assert step > 1e-3
    assert (fast - slow).abs().max() < 1e-4 * step  # seen: 8e-7 of the step
    torch.testing.assert_close(fast_loss, slow_loss, rtol=1e-5, atol=1e-6)


def test_mse_loss_is_taken_per_agent() -> None:
    _, fast, slow, fast_loss, slow_loss = _both("linear", torch.float64, 0.5, "mse", classes=1)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(fast_loss, slow_loss, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("rho", [0.0, 0.5])
@pytest.mark.parametrize("kind", ["mlp", "linear", "medium"])
def test_the_fused_dense_step_is_autograd_s_step_in_float64(kind: str, rho: float) -> None:
    # The written-out backward against autograd over the same stacked forward, 4 steps of
    # 3 agents: parameters and the losses reported per agent.
    model = build_model(kind, SHAPES[kind], 10, seed=0).double()
    fused = fused_step(model)
    assert fused is not None
    params = _stacked(model, 3, torch.float64)
    g = torch.Generator().manual_seed(4)
    x = torch.rand(4, 3, 7, *SHAPES[kind], generator=g, dtype=torch.float64) - 0.5
    y = torch.randint(0, 10, (4, 3, 7), generator=g)
    forward = stacked_forward(model)
    want, want_loss = batched_local_update(model, params, x, y, lr=0.3, rho=rho,
                                           loss="cross_entropy", forward=forward)
    got, got_loss = batched_local_update(model, params, x, y, lr=0.3, rho=rho,
                                         loss="cross_entropy", forward=forward, fused=fused)
    assert not torch.allclose(got[next(iter(got))], params[next(iter(params))])
    for name in params:
        torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-7)


def test_only_peerd_s_dense_chains_get_a_fused_step_and_only_for_cross_entropy() -> None:
    assert fused_step(build_model("cnn", SHAPES["cnn"], 10, seed=0)) is None
    assert fused_step(nn.Sequential(nn.Linear(3, 2))) is None
    model = build_model("linear", SHAPES["linear"], 1, seed=0)
    fused = fused_step(model)
    assert fused is not None
    params = _stacked(model, 2, torch.float32)
    with pytest.raises(ValueError, match="cross-entropy"):
        batched_local_update(model, params, torch.zeros(1, 2, 3, 16), torch.zeros(1, 2, 3),
                             lr=0.1, rho=0.0, loss="mse", fused=fused)
