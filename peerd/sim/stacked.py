"""Forward passes of A stacked models of a known architecture, written without vmap.

:func:`peerd.core.local_update.batched_local_update` trains A copies of one model at once;
by default it differentiates ``vmap(functional_call(model, ...))``. For the architectures
the simulator runs most, this module writes that forward pass directly over the stacked
parameters ``{name: [A, *shape]}`` and inputs ``[A, B, ...]``, so plain autograd can take the
gradient (the sum of the agents' losses: each agent's parameters only reach its own loss):

* dense layers are one ``baddbmm`` for all agents;
* the paper's CNN runs its two conv blocks agent by agent (plain ``conv2d`` on that agent's
  batch, which oneDNN runs well at batch 64; each agent's working set of ~5 MB stays in
  cache) and its dense layers batched. vmap turns the convolutions into grouped ones
  (``groups = A``) with layout copies around them; grouped convolutions written directly
  (``[B, A·C, H, W]``) and im2col + ``baddbmm`` for the first block were both slower than
  this in CPU time (one thread, 18 agents, 2-core machine). Each conv block is convolution,
  max-pool, then ReLU: ReLU and max-pool commute (both monotone), so ReLU and its backward
  run on a quarter of the pixels (loss and gradients are the same values: the pooled
  maximum picks the same pixel, and a non-positive maximum passes no gradient either way).

For the dense chains :func:`fused_step` also writes the backward pass out, and with it the
whole proximal step: with autograd, each step writes every weight gradient as a tensor of its
own and then passes over the stacked parameters twice more (``lerp_`` towards x̄, ``add_`` of
the gradient); here each weight is stepped by the product that computes its gradient,
W ← (1 − ηρ)·W − η·gᵀh in one in-place ``baddbmm_``, plus one pass adding ηρ·x̄: for the MNIST
MLP's 100 × 64 × 784 first layer that is 20 MB written once and read twice fewer a step
(issue 28 item 8; docs/benchmarks.md has the round's speed).

:func:`stacked_forward` gives ``None`` for any other architecture; the caller then keeps
vmap. What it returns must compute exactly the model's ``forward`` (tests/sim/test_stacked.py
holds each against the per-agent loop).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.nn import functional

from peerd.core.local_update import FusedStep
from peerd.learn.models import MLP, DeepMLP, PaperCNN

#: (stacked params, inputs [A, B, ...]) -> outputs [A, B, classes].
StackedForward = Callable[[Mapping[str, torch.Tensor], torch.Tensor], torch.Tensor]


def stacked_forward(model: nn.Module) -> StackedForward | None:
    """The stacked forward pass of ``model``'s architecture, or None where none is written."""
    if type(model) is PaperCNN:
        return _paper_cnn
    kinds = _dense_layers(model)
    return None if kinds is None else _dense_chain(kinds)


def _linear(p: Mapping[str, torch.Tensor], name: str, h: torch.Tensor) -> torch.Tensor:
    # [A, B, in] x [A, in, out] + [A, 1, out]: one batched product for every agent.
    return torch.baddbmm(p[f"{name}.bias"].unsqueeze(1), h, p[f"{name}.weight"].transpose(1, 2))


def _dense_chain(kinds: list[tuple[str, bool]]) -> StackedForward:
    """``nn.Linear`` / ``nn.ReLU`` layers in sequence (MLP, DeepMLP) on flattened inputs."""

    def forward(p: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        h = x.flatten(2)
        for name, linear in kinds:
            h = _linear(p, name, h) if linear else torch.relu(h)
        return h

    return forward


def _dense_layers(model: nn.Module) -> list[tuple[str, bool]] | None:
    """(parameter prefix, is linear) for an MLP's ``nn.Linear`` / ``nn.ReLU`` chain."""
    if type(model) not in (MLP, DeepMLP) or not isinstance(model.net, nn.Module):
        return None
    net = model.net
    layers = [("net", net)] if isinstance(net, nn.Linear) else [
        (f"net.{i}", m) for i, m in enumerate(net.children())]
    kinds: list[tuple[str, bool]] = []
    for name, m in layers:
        if type(m) is nn.Linear and m.bias is not None:
            kinds.append((name, True))
        elif type(m) is nn.ReLU:
            kinds.append((name, False))
        else:
            return None
    return kinds


def fused_step(model: nn.Module) -> FusedStep | None:
    """One proximal cross-entropy step of A stacked dense chains, backward written out.

    The same step as autograd over :func:`stacked_forward` and then
    :func:`peerd.core.local_update.stacked_step_`: x ← (1 − ηρ)x + ηρx̄ − η∇, with ∇ the
    gradient of each agent's mean cross-entropy over its own batch. Per linear layer, from
    the last: the input gradient g·W (past the first layer) while W is still the old one, then
    W.baddbmm_(gᵀ, h, beta=1 − ηρ, alpha=−η) and the bias likewise; ReLU passes g where its
    output is positive. ``None`` for anything but peerd's MLPs."""
    kinds = _dense_layers(model)
    if kinds is None:
        return None
    first = next(i for i, (_, linear) in enumerate(kinds) if linear)

    def step(p: dict[str, torch.Tensor], x: torch.Tensor, t: torch.Tensor,
             anchors: Mapping[str, torch.Tensor] | None, lr: float, rho: float) -> torch.Tensor:
        h = x.flatten(2)
        saved: list[torch.Tensor] = []  # each layer's input (linear) or output (ReLU)
        for i, (name, linear) in enumerate(kinds):
            if linear:
                saved.append(h)
                h = _linear(p, name, h)
            else:
                # In place on a product's fresh output; out of place on the caller's inputs.
                h = h.clamp_(min=0) if i > 0 else torch.relu(h)
                saved.append(h)
        logp = torch.log_softmax(h, dim=-1)
        values = -logp.gather(-1, t.unsqueeze(-1)).squeeze(-1).mean(dim=1)
        # d(mean CE)/d(logits) = (softmax − onehot) / B, per agent.
        g = logp.exp_()
        g.scatter_add_(-1, t.unsqueeze(-1), torch.full((*t.shape, 1), -1.0, dtype=g.dtype))
        g.mul_(1.0 / t.shape[1])
        keep = 1.0 - lr * rho
        pull = anchors if rho != 0 else None  # with ρ = 0 the step is plain SGD
        for i in range(len(kinds) - 1, first - 1, -1):
            name, linear = kinds[i]
            if not linear:
                g.masked_fill_(saved[i] <= 0, 0.0)
                continue
            w, b = p[f"{name}.weight"], p[f"{name}.bias"]
            below = torch.bmm(g, w) if i > first else None  # [A, B, in], with the old W
            w.baddbmm_(g.transpose(1, 2), saved[i], beta=keep, alpha=-lr)
            if keep != 1.0:
                b.mul_(keep)
            b.add_(g.sum(dim=1), alpha=-lr)
            if pull is not None:
                w.add_(pull[f"{name}.weight"], alpha=lr * rho)
                b.add_(pull[f"{name}.bias"], alpha=lr * rho)
            if below is not None:
                g = below
        return values

    return step


def _conv_block(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One agent's conv, max-pool 2, ReLU (the model's ReLU, max-pool: the same values)."""
    return torch.relu(torch.max_pool2d(functional.conv2d(h, w, b), 2))


def _paper_cnn(p: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    # unbind, not p[...][a]: its backward stacks the A slices' gradients once, where indexing
    # would scatter each agent's gradient into a fresh zero tensor of all A agents.
    w1, b1, w2, b2 = (p[k].unbind(0) for k in
                      ("conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"))
    features = [_conv_block(_conv_block(xa, w1[a], b1[a]), w2[a], b2[a]).flatten(1)
                for a, xa in enumerate(x.unbind(0))]
    h = torch.stack(features)  # [A, B, 64·4·4]
    return _linear(p, "fc2", torch.relu(_linear(p, "fc1", h)))
