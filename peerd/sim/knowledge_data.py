"""The FedCache experiment's data, model stacks and metrics, shared by its runners.

Each client's training part (a Dirichlet split) and a test split with its own label mix; the
clients of one architecture as one stack of parameters (so a round trains them batched);
the per-round evaluation and the metrics read from it (:mod:`peerd.sim.maua`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.func import functional_call

from peerd.learn.data import load_dataset, partition
from peerd.learn.models import build_model, count_parameters
from peerd.sim.knowledge_config import MIXED, KnowledgeSimConfig
from peerd.sim.maua import acc_at, maua, mean_of_client_best

#: Called after every round with the rounds done and the run's outputs so far.
Tick = Callable[[int, dict[str, Any]], None]


def client_test_split(train_parts: Sequence[np.ndarray], y_train: np.ndarray,
                      y_test: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Each client's test indices, with its training label mix: class c's test samples are
    dealt to clients in proportion to their share of class c in training."""
    k = len(train_parts)
    out: list[list[np.ndarray]] = [[] for _ in range(k)]
    for c in np.unique(y_test):
        have = np.array([(y_train[p] == c).sum() for p in train_parts], dtype=np.float64)
        idx = rng.permutation(np.flatnonzero(y_test == c))
        if have.sum() == 0:
            continue
        cuts = (np.cumsum(have / have.sum())[:-1] * len(idx)).astype(np.int64)
        for a, chunk in enumerate(np.split(idx, cuts)):
            out[a].append(chunk)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in out]


@dataclass
class Setup:
    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    train: list[np.ndarray]
    test: list[np.ndarray]
    steps: int | list[int]  # one count for every client, or each client's own
    mean_steps: int
    num_classes: int
    input_shape: tuple[int, ...]


def make_setup(config: KnowledgeSimConfig) -> Setup:
    seeds = np.random.SeedSequence(config.seed).spawn(3)
    data = load_dataset(config.dataset)
    parts = partition(data.y_train, config.agents, f"dirichlet:{config.dirichlet}",
                      np.random.default_rng(seeds[0]))
    tests = client_test_split(parts, data.y_train.numpy(), data.y_test.numpy(),
                       np.random.default_rng(seeds[1]))
    mean_steps = math.ceil(np.mean([len(p) for p in parts]) / config.batch_size)
    steps: int | list[int] = mean_steps
    if config.local_epoch == "client":
        steps = [math.ceil(len(p) / config.batch_size) for p in parts]
    return Setup(data.x_train, data.y_train, data.x_test, data.y_test, parts, tests, steps,
                  mean_steps, data.num_classes, data.input_shape)


# ------------------------------------------------------------------ models as stacks


class Group:
    """The clients of one architecture: their parameters stacked ``{name: [g, *shape]}``."""

    def __init__(self, kind: str, members: list[int], setup: Setup, seed: int) -> None:
        self.kind = kind
        self.members = members
        self.model = build_model(kind, setup.input_shape, setup.num_classes, seed=seed)
        self.params_count = count_parameters(self.model)
        init = {n: p.detach() for n, p in self.model.named_parameters()}
        # Every client of an architecture starts from the same seeded init (as a fleet does).
        self.stack = {n: t.expand(len(members), *t.shape).clone() for n, t in init.items()}

    def params_of(self, i: int) -> dict[str, torch.Tensor]:
        return {n: t[i] for n, t in self.stack.items()}

    @torch.no_grad()
    def logits(self, i: int, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = functional_call(self.model, self.params_of(i), (x,))
        return out


def make_groups(config: KnowledgeSimConfig, setup: Setup) -> list[Group]:
    kinds = sorted({config.model_of(a) for a in range(config.agents)}, key=MIXED.index)
    return [Group(k, [a for a in range(config.agents) if config.model_of(a) == k], setup,
                   config.seed) for k in kinds]


def evaluate(groups: Sequence[Group], setup: Setup, agents: int) -> np.ndarray:
    acc = np.full(agents, np.nan)
    for g in groups:
        for i, a in enumerate(g.members):
            idx = torch.from_numpy(setup.test[a])
            if idx.numel() == 0:
                continue
            pred = g.logits(i, setup.x_test[idx]).argmax(dim=1)
            acc[a] = float((pred == setup.y_test[idx]).double().mean())
    return acc



def acc_at_targets(curve: Sequence[Sequence[float]], targets: Sequence[float]
                   ) -> dict[str, dict[str, int] | None]:
    return {f"{t:g}": acc_at(curve, t) for t in targets}


def metrics(evals: Sequence[np.ndarray]) -> dict[str, float]:
    if not evals:  # no round evaluated yet (eval_every > rounds done)
        return {"maua": math.nan, "mean_of_client_best": math.nan}
    return {"maua": maua(evals), "mean_of_client_best": mean_of_client_best(evals)}
