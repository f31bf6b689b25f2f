from __future__ import annotations

from typing import Any

import numpy as np
import torch

from peerd.core.entry import flatten
from peerd.learn.models import build_model
from peerd.sim.train import (
    draw_batches,
    evaluate,
    matrix_to_stack,
    model_schema,
    saved_floats_per_sample,
    stack_to_matrix,
    train_batched,
    train_loop,
)


def _setup(agents: int = 4) -> tuple[Any, ...]:
    torch.manual_seed(0)
    model = build_model("mlp", (16,), 3, seed=0)
    schema = model_schema(model)
    init = flatten(dict(model.named_parameters()), schema)
    matrix = init + 0.01 * torch.randn(agents, init.numel())
    x = torch.randn(200, 16)
    y = torch.randint(0, 3, (200,))
    # Agent 3 holds fewer samples than the batch size: the batched path must group it.
    idx = [np.arange(0, 60), np.arange(60, 120), np.arange(120, 190), np.arange(190, 200)]
    return model, schema, matrix, x, y, idx[:agents]


def test_stack_roundtrip() -> None:
    _, schema, matrix, *_ = _setup()
    assert torch.equal(stack_to_matrix(matrix_to_stack(matrix, schema), schema), matrix)


def test_batched_training_matches_the_per_agent_core_loop() -> None:
    model, schema, matrix, x, y, idx = _setup()
    for rho in (0.0, 0.5):
        batches = draw_batches(idx, 5, 32, seed=1, round_index=2)
        fast, fast_loss = train_batched(model, matrix, schema, x, y, batches, lr=0.1, rho=rho)
        slow, slow_loss = train_loop(
            model,
            matrix,
            schema,
            x,
            y,
            idx,
            steps=5,
            batch_size=32,
            lr=0.1,
            rho=rho,
            seed=1,
            round_index=2,
        )
        torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(fast_loss, slow_loss, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(fast, matrix)  # it did train


def test_batches_depend_on_seed_round_and_agent() -> None:
    _, _, _, _, _, idx = _setup()
    a = draw_batches(idx, 3, 8, seed=1, round_index=0)
    assert all(torch.equal(p, q) for p, q in zip(a, draw_batches(idx, 3, 8, 1, 0), strict=True))
    assert not torch.equal(a[0], draw_batches(idx, 3, 8, 1, 1)[0])
    assert not torch.equal(a[0], draw_batches(idx, 3, 8, 2, 0)[0])
    assert a[3].shape == (3, 8)
    assert set(a[3].flatten().tolist()) <= set(range(190, 200))


def test_evaluate_matches_a_plain_forward_pass() -> None:
    model, schema, matrix, x, y, _ = _setup()
    matrix = torch.cat([matrix, matrix[:1]])  # a duplicate row is evaluated once, reported twice
    acc = evaluate(model, matrix, schema, x, y, chunk=64, agents_per_call=2)
    for a in range(matrix.shape[0]):
        params = dict(
            zip(
                [s.name for s in schema.float_specs],
                matrix_to_stack(matrix[a : a + 1], schema).values(),
                strict=True,
            )
        )
        logits = torch.func.functional_call(model, {k: v[0] for k, v in params.items()}, (x,))
        assert acc[a] == (logits.argmax(1) == y).double().mean().item()
    assert acc[0] == acc[-1]


def test_a_big_model_trains_in_calls_that_fit_the_activation_budget() -> None:
    model, schema, matrix, x, y, idx = _setup()
    per_sample = saved_floats_per_sample(model, x[0])
    # The MLP 16 -> 64 -> 3 saves its input, hidden layer (twice: pre-ReLU and ReLU output's
    # mask) and logits: about 16 + 2 * 64 + 3 floats a sample, parameters not counted.
    assert 100 < per_sample < 300
    batches = draw_batches(idx, 3, 32, seed=1, round_index=0)
    whole, _ = train_batched(model, matrix, schema, x, y, batches, lr=0.1, rho=0.5)
    tight, _ = train_batched(model, matrix, schema, x, y, batches, lr=0.1, rho=0.5,
                             agents_per_call=1)
    torch.testing.assert_close(whole, tight, rtol=1e-5, atol=1e-6)
