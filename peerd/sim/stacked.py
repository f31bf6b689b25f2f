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

:func:`stacked_forward` gives ``None`` for any other architecture; the caller then keeps
vmap. What it returns must compute exactly the model's ``forward`` (tests/sim/test_stacked.py
holds each against the per-agent loop).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.nn import functional

from peerd.learn.models import MLP, DeepMLP, PaperCNN

#: (stacked params, inputs [A, B, ...]) -> outputs [A, B, classes].
StackedForward = Callable[[Mapping[str, torch.Tensor], torch.Tensor], torch.Tensor]


def stacked_forward(model: nn.Module) -> StackedForward | None:
    """The stacked forward pass of ``model``'s architecture, or None where none is written."""
    if type(model) is PaperCNN:
        return _paper_cnn
    if type(model) in (MLP, DeepMLP) and isinstance(model.net, nn.Module):
        return _dense_chain(model.net)
    return None


def _linear(p: Mapping[str, torch.Tensor], name: str, h: torch.Tensor) -> torch.Tensor:
    # [A, B, in] x [A, in, out] + [A, 1, out]: one batched product for every agent.
    return torch.baddbmm(p[f"{name}.bias"].unsqueeze(1), h, p[f"{name}.weight"].transpose(1, 2))


def _dense_chain(net: nn.Module) -> StackedForward | None:
    """``nn.Linear`` / ``nn.ReLU`` layers in sequence (MLP, DeepMLP) on flattened inputs."""
    layers = [("net", net)] if isinstance(net, nn.Linear) else [
        (f"net.{i}", m) for i, m in enumerate(net.children())]
    kinds: list[tuple[str, bool]] = []  # (parameter prefix, is linear)
    for name, m in layers:
        if type(m) is nn.Linear and m.bias is not None:
            kinds.append((name, True))
        elif type(m) is nn.ReLU:
            kinds.append((name, False))
        else:
            return None

    def forward(p: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        h = x.flatten(2)
        for name, linear in kinds:
            h = _linear(p, name, h) if linear else torch.relu(h)
        return h

    return forward


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
