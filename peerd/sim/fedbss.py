"""The simulator's FedBSS local update (``peerd sim --local-policy fedbss``).

One agent after another through the core's :func:`peerd.core.fedbss.curriculum_update` (a
curriculum round's epochs have a different sample mix per agent and per epoch, so they do not
stack into one vmap the way the plain round's K steps do). Warm-up rounds are not here: they
are the plain batched update itself (:mod:`peerd.sim.runner`).

Owns only the per-agent call; the loop over agents is :func:`peerd.sim.train.train_each`, the
curriculum :mod:`peerd.core.fedbss`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from peerd.core.entry import Schema
from peerd.core.fedbss import FedBSS, curriculum_update
from peerd.sim.train import agent_generator, train_each


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
    return train_each(
        model, matrix, schema, x, y, agent_indices,
        lambda xa, ya, a: curriculum_update(
            model, xa, ya, batch_size=batch_size, lr=lr, rho=rho, policy=policy,
            generator=agent_generator(seed, round_index, a), steps=steps))
