"""The sensor task of cordial mode (issue 17): samples aligned by a **time bucket**.

Every node of a sensor fleet observes the same moments: bucket k (peerd.core.timebuckets) is
a sample every node sees. What a node sees of bucket k is its own agent's component of one
fleet-wide draw of the cordial paper's §6.1 linear problem (:mod:`peerd.learn.linearproblem`:
agents' inputs correlated by R, agent i's label Y_i = A_i X_i + Σ_j B_j^i X_j depending on the
others' inputs), drawn deterministically from (``[task] seed``, k): two nodes of one seed
compute the same draw for a bucket and keep different components, so the ids align without a
sample crossing the network. Generated data only; nothing is downloaded.

Owns the fleet-wide draw (the bucket arithmetic is :mod:`peerd.core.timebuckets`'s); the
plain-task face of the same data is :class:`peerd.learn.tasks.SensorTask`. Deterministic
functions of their arguments: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from peerd.learn.linearproblem import M_OUT, D, LinearProblem, make_problem

#: The input distribution of the draw (§6.1's Gaussian setting).
DISTRIBUTION = "gaussian"


@dataclass
class SensorFleet:
    """The fleet-wide problem of ``agents`` sensors: §6.1's ground truth drawn from ``seed``
    (the same on every node) and, per bucket, one correlated draw of every agent's input."""

    agents: int
    seed: int
    problem: LinearProblem = field(init=False)

    def __post_init__(self) -> None:
        if self.agents < 2:
            raise ValueError(f"a sensor fleet needs at least 2 agents, got {self.agents}")
        self.problem = make_problem(self.agents, DISTRIBUTION, 1, self.seed)

    def draw(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every agent's input [N, d] and label [N, m] (float64) for ``bucket``: a function of
        (seed, bucket) alone."""
        if bucket < 0:
            raise ValueError(f"bucket {bucket} < 0")
        words = np.random.SeedSequence([self.seed, self.agents, bucket]).generate_state(2)
        gen = torch.Generator().manual_seed(int(words[0]) << 32 | int(words[1]))
        x = self.problem.sample(1, gen)  # [1, 1, N, d]
        return x[0, 0], self.problem.labels(x)[0, 0]

    def observe(self, index: int, buckets: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Agent ``index``'s inputs [w, d] and labels [w, m] for ``buckets``: its component of
        each bucket's fleet-wide draw."""
        if not 0 <= index < self.agents:
            raise ValueError(f"agent index {index} outside [0, {self.agents})")
        xs = torch.zeros(len(buckets), D, dtype=torch.float64)
        ys = torch.zeros(len(buckets), M_OUT, dtype=torch.float64)
        for row, b in enumerate(buckets):
            x, y = self.draw(b)
            xs[row], ys[row] = x[index], y[index]
        return xs, ys
