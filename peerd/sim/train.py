"""Training and evaluating all agents of a round together, around the core's local update.

Agents' models live as rows of one ``[A, D]`` float32 matrix in the core's flat layout
(:func:`peerd.core.entry.flatten` order), which is what :func:`peerd.core.blend.blend_rows`
blends. Training converts that matrix to stacked named tensors ``[A, *shape]`` and calls
:func:`peerd.core.local_update.batched_local_update` (all agents at once: vmap, or a forward
pass written over stacked parameters, :mod:`peerd.sim.stacked`); the per-agent loop
(:func:`train_loop`) calls :func:`peerd.core.local_update.local_update` one agent at a time and
exists as the benchmark's baseline and as the reference the batched path is tested against;
its loop (:func:`train_each`) also carries the FedBSS curriculum (:mod:`peerd.sim.engine`).
It must not blend or decide anything of a round (the core round and :mod:`peerd.sim.algorithms`
do); each agent's batches come from its own seeded generator, never the global RNG.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from peerd.core.entry import Schema
from peerd.core.local_update import (
    GatheredBatches,
    LocalResult,
    LossName,
    batched_local_update,
    local_update,
    sample_batches,
)
from peerd.sim.stacked import fused_step, stacked_forward


def model_schema(model: nn.Module) -> Schema:
    return Schema.of(dict(model.named_parameters()))


def matrix_to_stack(
    matrix: torch.Tensor, schema: Schema, *, copy: bool = True
) -> dict[str, torch.Tensor]:
    """``[A, D]`` flat rows -> ``{name: [A, *shape]}``: copies, so training never aliases,
    or (``copy=False``) strided views of ``matrix`` for a reader that copies them itself."""
    out: dict[str, torch.Tensor] = {}
    offset = 0
    rows = matrix.shape[0]
    for s in schema.float_specs:
        view = matrix[:, offset : offset + s.numel].reshape(rows, *s.shape)
        out[s.name] = view.clone() if copy else view
        offset += s.numel
    return out


def stack_to_matrix(
    stack: dict[str, torch.Tensor], schema: Schema, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Inverse of :func:`matrix_to_stack`."""
    rows = next(iter(stack.values())).shape[0]
    if out is None:
        out = torch.empty(rows, schema.flat_size, dtype=torch.float32)
    offset = 0
    for s in schema.float_specs:
        out[:, offset : offset + s.numel].copy_(stack[s.name].reshape(rows, -1))
        offset += s.numel
    return out


def agent_generator(seed: int, round_index: int, agent: int) -> torch.Generator:
    """The batch sampler's generator for one agent in one round.

    Derived from (seed, round, agent) only, so every algorithm in a run draws the very same
    mini-batches and the batched and per-agent paths agree sample for sample.
    """
    state = np.random.SeedSequence([seed, round_index, agent]).generate_state(2, np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))


def draw_batches(
    agent_indices: Sequence[np.ndarray],
    steps: int | Sequence[int],
    batch_size: int,
    seed: int,
    round_index: int,
) -> list[torch.Tensor]:
    """Per agent, ``[steps, b]`` indices into the training set (``b = min(batch, n_i)``);
    ``steps`` is one count for every agent or each agent's own."""
    out = []
    for a, idx in enumerate(agent_indices):
        k = steps if isinstance(steps, int) else steps[a]
        local = sample_batches(len(idx), batch_size, k, agent_generator(seed, round_index, a))
        out.append(torch.from_numpy(idx)[local])
    return out


#: Floats of saved activations one vmapped call may hold (128 MB). Past it the step touches
#: fresh pages and falls out of cache: one MNIST-CNN step of 100 agents x 64 images holds
#: ~1.5 GB and ran in 14.1 s all at once against 7.4 s in calls of 10 agents (and 11.6 s of
#: 25), one run on the loaded 2-core machine; the MLPs hold a few MB and stay one call.
ACTIVATION_BUDGET = 32 * 2**20
#: The same for a stacked forward pass (:mod:`peerd.sim.stacked`), 48 MB: the CNN's 18
#: agents x 64 images ran in 1.84 s wall (1.87 s CPU: one thread busy of two) in calls of
#: 9 agents, 0.71 s in calls of 3 or of 1, against 0.79-0.89 s for the per-agent loop (one
#: run each on the 2-core machine, load ~3). The MLPs save ~1k floats a sample or fewer
#: and still train all agents in one call.
STACKED_ACTIVATION_BUDGET = 12 * 2**20


def saved_floats_per_sample(model: nn.Module, sample: torch.Tensor) -> int:
    """Floats autograd saves for backward on one sample, parameters not counted."""
    params = {p.data_ptr() for p in model.parameters()}
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if t.data_ptr() not in params:
            total += t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(sample.unsqueeze(0))
    return total


def train_batched(
    model: nn.Module,
    matrix: torch.Tensor,
    schema: Schema,
    x: torch.Tensor,
    y: torch.Tensor,
    batches: Sequence[torch.Tensor],
    *,
    lr: float,
    rho: float,
    loss: LossName = "cross_entropy",
    agents_per_call: int = 0,
    stacked: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Train every row of ``matrix`` on its agent's batches; returns (new matrix, mean loss).

    Where :mod:`peerd.sim.stacked` writes the model's forward pass over stacked parameters
    (the paper's CNN, the MLPs) it is differentiated by plain autograd; otherwise, or with
    ``stacked=False``, by vmap over ``functional_call``.

    Agents with fewer samples than the batch size draw smaller batches; vmap needs one batch
    shape, so agents are grouped by batch size (one group in the common case). Groups are cut
    into calls of at most ``agents_per_call`` agents (0: as many as keep the saved
    activations within :data:`ACTIVATION_BUDGET`, :data:`STACKED_ACTIVATION_BUDGET` for a
    stacked forward pass): for a big model the activations of 100
    agents x 64 samples run to hundreds of MB per layer, and smaller calls stay in cache
    instead of faulting in fresh pages every step.
    """
    agents = matrix.shape[0]
    forward = stacked_forward(model) if stacked else None
    fused = fused_step(model) if stacked and loss == "cross_entropy" else None
    new = torch.empty_like(matrix)
    losses = torch.empty(agents)
    sizes = np.array([b.shape[1] if b.dim() == 2 else 0 for b in batches])
    chunks = []
    per_sample = saved_floats_per_sample(model, x[0]) if agents_per_call <= 0 else 0
    budget = ACTIVATION_BUDGET if forward is None else STACKED_ACTIVATION_BUDGET
    for size in np.unique(sizes):
        same = np.flatnonzero(sizes == size)
        step = (agents_per_call if agents_per_call > 0 else
                max(1, budget // max(1, int(size) * per_sample)))
        chunks += [same[i : i + step] for i in range(0, len(same), step)]
    for group in chunks:
        idx = torch.stack([batches[int(a)] for a in group], dim=1)  # [K, g, b]
        # batched_local_update copies its inputs once and leaves them alone, so it may read
        # views of the matrix; the common single group of all agents needs no gather either.
        whole = len(group) == agents
        rows = matrix if whole else matrix[torch.from_numpy(group)]
        trained, group_loss = batched_local_update(
            model, matrix_to_stack(rows, schema, copy=False), GatheredBatches(x, idx), y[idx],
            lr=lr, rho=rho, loss=loss, forward=forward, fused=fused)
        if whole:
            stack_to_matrix(trained, schema, out=new)
        else:
            new[torch.from_numpy(group)] = stack_to_matrix(trained, schema)
        losses[torch.from_numpy(group)] = group_loss
    return new, losses


def train_loop(
    model: nn.Module,
    matrix: torch.Tensor,
    schema: Schema,
    x: torch.Tensor,
    y: torch.Tensor,
    agent_indices: Sequence[np.ndarray],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    rho: float,
    seed: int,
    round_index: int,
    loss: LossName = "cross_entropy",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: one agent after another through the core's ``local_update``."""
    return train_each(
        model, matrix, schema, x, y, agent_indices,
        lambda xa, ya, a: local_update(
            model, xa, ya, steps=steps, batch_size=batch_size, lr=lr, rho=rho, loss=loss,
            generator=agent_generator(seed, round_index, a)))


def train_each(
    model: nn.Module,
    matrix: torch.Tensor,
    schema: Schema,
    x: torch.Tensor,
    y: torch.Tensor,
    agent_indices: Sequence[np.ndarray],
    train: Callable[[torch.Tensor, torch.Tensor, int], LocalResult],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One agent after another: load row ``a`` of ``matrix`` into ``model``, let
    ``train(X_a, y_a, a)`` train it in place on the agent's samples, read the row back.

    Returns the new ``[A, D]`` matrix and each agent's mean loss ``[A]``."""
    new = torch.empty_like(matrix)
    losses = torch.empty(matrix.shape[0])
    for a, idx in enumerate(agent_indices):
        with torch.no_grad():
            _load_row(model, matrix[a], schema)
        sel = torch.from_numpy(idx)
        result = train(x[sel], y[sel], a)
        new[a] = torch.cat([p.detach().reshape(-1) for _, p in _ordered(model, schema)])
        losses[a] = result.mean_loss
    return new, losses


def _ordered(model: nn.Module, schema: Schema) -> list[tuple[str, torch.nn.Parameter]]:
    params = dict(model.named_parameters())
    return [(s.name, params[s.name]) for s in schema.float_specs]


def _load_row(model: nn.Module, row: torch.Tensor, schema: Schema) -> None:
    offset = 0
    for s, (_, p) in zip(schema.float_specs, _ordered(model, schema), strict=True):
        p.copy_(row[offset : offset + s.numel].view(s.shape))
        offset += s.numel


@torch.no_grad()
def evaluate(
    model: nn.Module,
    matrix: torch.Tensor,
    schema: Schema,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    chunk: int = 2000,
    agents_per_call: int = 25,
) -> np.ndarray:
    """Accuracy of every row of ``matrix`` on the whole test set ``(x, y)``: ``[A]`` float64.

    Identical rows (e.g. FedAvg, where all agents hold the global model) are evaluated once.
    """
    uniq, inverse = torch.unique(matrix, dim=0, return_inverse=True)
    correct = torch.zeros(uniq.shape[0], dtype=torch.int64)

    def logits(p: dict[str, torch.Tensor], xb: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = functional_call(model, p, (xb,))
        return out

    forward = vmap(logits, in_dims=(0, None))
    for start in range(0, uniq.shape[0], agents_per_call):
        rows = uniq[start : start + agents_per_call]
        stack = matrix_to_stack(rows, schema)
        for lo in range(0, x.shape[0], chunk):
            pred = forward(stack, x[lo : lo + chunk]).argmax(dim=-1)
            correct[start : start + rows.shape[0]] += (pred == y[lo : lo + chunk]).sum(dim=1)
    acc = correct.to(torch.float64) / x.shape[0]
    return acc[inverse].numpy()
