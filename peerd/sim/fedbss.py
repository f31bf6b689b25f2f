"""The simulator's FedBSS local update (``peerd sim --local-policy fedbss``).

One agent after another through the core's :func:`peerd.core.fedbss.curriculum_update` (a
curriculum round's epochs have a different sample mix per agent and per epoch, so they do not
stack into one vmap the way the plain round's K steps do). Warm-up rounds are not here: they
are the plain batched update itself (:mod:`peerd.sim.runner`).

Owns only this loop; the curriculum is :mod:`peerd.core.fedbss`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from peerd.core.entry import Schema
from peerd.core.fedbss import FedBSS, curriculum_update
from peerd.sim.train import _load_row as load_row
from peerd.sim.train import _ordered as ordered_params
from peerd.sim.train import agent_generator


def train_curriculum(
    model: nn.Module,
    matrix: torch.Tensor,
    schema: Schema,
    x: torch.Tensor,
    y: torch.Tensor,
    agent_indices: Sequence[np.ndarray],
    *,
    policy: FedBSS,
    batch_size: int,
    lr: float,
    rho: float,
    seed: int,
    round_index: int,
    steps: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A curriculum round for every agent: new ``[A, P]`` parameters and mean losses ``[A]``.

    ``steps`` > 0: that many SGD steps per agent (the core's step budget); 0: full epochs."""
    new = torch.empty_like(matrix)
    losses = torch.empty(matrix.shape[0])
    for a, idx in enumerate(agent_indices):
        with torch.no_grad():
            load_row(model, matrix[a], schema)
        sel = torch.from_numpy(idx)
        result = curriculum_update(model, x[sel], y[sel], batch_size=batch_size, lr=lr, rho=rho,
                                   policy=policy, generator=agent_generator(seed, round_index, a),
                                   steps=steps)
        new[a] = torch.cat([p.detach().reshape(-1) for _, p in ordered_params(model, schema)])
        losses[a] = result.mean_loss
    return new, losses
