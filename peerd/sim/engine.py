"""Where a round's local training runs: the shards every engine cuts, and the local engine.

A round's training is cut into **shards** of ``shard_agents`` consecutive agents (the last may
be shorter) and each shard is trained by :func:`train_shard`, single-threaded. The cut depends
only on the run's configuration, never on the engine or its number of workers, because the
floats do depend on it: vmap over 12 agents and over 24 sums some gradients in a different
order, and so do 1 and 2 intra-op threads (measured: ~1e-8 apart after three steps, which the
following rounds amplify). Fixing both makes a shard's result a function of its inputs alone,
so :class:`LocalEngine` (every shard in this process, one after another) and
:class:`peerd.sim.rayengine.RayEngine` (shards spread over Ray actors) write byte-identical
summaries for the same seed.

Each agent's mini-batches come from its own generator (:func:`peerd.sim.train.agent_generator`,
seeded by run, round and *global* agent index), so a shard draws what the whole fleet would.
This module trains only: it must not blend, move agents or decide anything of a round.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import torch
from torch import nn

from peerd.core.entry import Schema
from peerd.core.fedbss import FedBSS, curriculum_update
from peerd.core.local_update import local_update, sample_batches
from peerd.sim.train import agent_generator, model_schema, train_batched, train_each

#: The shard's training runs on one intra-op thread everywhere (see the module docstring);
#: engines get their parallelism from running shards side by side.
SHARD_THREADS = 1

TrainMode = Literal["batched", "loop", "curriculum"]


@dataclass(frozen=True)
class TrainSetup:
    """What every shard of a run trains with: set once per run, shipped once per worker."""

    model: nn.Module  # the architecture only: parameters come from the matrix rows
    x: torch.Tensor  # the whole training set (mixed-schema copies, flipped labels included)
    y: torch.Tensor
    agent_idx: Sequence[np.ndarray]  # agent a's sample indices into x

    @property
    def schema(self) -> Schema:
        return model_schema(self.model)


@dataclass(frozen=True)
class TrainTask:
    """One round's local update for every agent: how, and with which hyperparameters."""

    mode: TrainMode
    round_index: int
    seed: int
    steps: int
    batch_size: int
    lr: float
    rho: float
    policy: FedBSS | None = None  # mode "curriculum"
    fedbss_steps: int = 0


def shard_bounds(agents: int, shard_agents: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of each shard: consecutive agents, ``shard_agents`` at a time."""
    if shard_agents < 1:
        raise ValueError("shard-agents must be >= 1")
    return [(lo, min(lo + shard_agents, agents)) for lo in range(0, agents, shard_agents)]


@contextmanager
def shard_threads() -> Iterator[None]:
    """Run the block on :data:`SHARD_THREADS` intra-op threads, then restore the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(SHARD_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_shard(setup: TrainSetup, task: TrainTask, lo: int,
                rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Agents ``lo .. lo + len(rows) - 1``'s local update: (new rows, mean loss per agent).

    The caller runs it under :func:`shard_threads`."""
    hi = lo + rows.shape[0]
    model, schema, x, y = setup.model, setup.schema, setup.x, setup.y
    idx = setup.agent_idx[lo:hi]
    if task.mode == "batched":
        batches = [
            torch.from_numpy(ix)[sample_batches(
                len(ix), task.batch_size, task.steps,
                agent_generator(task.seed, task.round_index, lo + i))]
            for i, ix in enumerate(idx)
        ]
        return train_batched(model, rows, schema, x, y, batches, lr=task.lr, rho=task.rho)
    if task.mode == "loop":
        return train_each(
            model, rows, schema, x, y, idx,
            lambda xa, ya, a: local_update(
                model, xa, ya, steps=task.steps, batch_size=task.batch_size, lr=task.lr,
                rho=task.rho, loss="cross_entropy",
                generator=agent_generator(task.seed, task.round_index, lo + a)))
    policy = task.policy
    if policy is None:
        raise ValueError("a curriculum task needs its FedBSS policy")
    return train_each(
        model, rows, schema, x, y, idx,
        lambda xa, ya, a: curriculum_update(
            model, xa, ya, batch_size=task.batch_size, lr=task.lr, rho=task.rho, policy=policy,
            generator=agent_generator(task.seed, task.round_index, lo + a),
            steps=task.fedbss_steps))


class Engine(Protocol):
    """Trains a round's shards. ``load`` once per run, then ``train`` per round and fleet."""

    name: str

    @property
    def workers(self) -> int: ...

    def load(self, setup: TrainSetup, shard_agents: int) -> None: ...

    def train(self, task: TrainTask,
              matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class LocalEngine:
    """Every shard in this process, one after another."""

    name = "local"

    def __init__(self) -> None:
        self._setup: TrainSetup | None = None
        self._shard_agents = 1

    @property
    def workers(self) -> int:
        return 1

    def load(self, setup: TrainSetup, shard_agents: int) -> None:
        self._setup = setup
        self._shard_agents = shard_agents

    def train(self, task: TrainTask,
              matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._setup is None:
            raise RuntimeError("LocalEngine.train before load")
        new = torch.empty_like(matrix)
        losses = torch.empty(matrix.shape[0])
        with shard_threads():
            for lo, hi in shard_bounds(matrix.shape[0], self._shard_agents):
                new[lo:hi], losses[lo:hi] = train_shard(self._setup, task, lo, matrix[lo:hi])
        return new, losses
