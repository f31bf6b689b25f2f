"""The daemon's local policy across rounds: ``[learning] local_policy`` and its state.

Plain training is stateless; FedBSS (:mod:`peerd.core.fedbss`) keeps one
:class:`~peerd.core.fedbss.WarmupState` per node between rounds (warm-up rounds done, data size
when the warm-up began). It lives in memory only: a restarted daemon warms up again, which is
what the lecture asks of a copy whose data may have changed meanwhile (§16.5.3).

Owns that state and the choice between the plain and the curriculum path; never reads data,
models or files itself (:mod:`peerd.learn.trainer` hands them in).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch
from torch import nn

from peerd.core.fedbss import FedBSS, WarmupState, fedbss_local_update
from peerd.core.local_update import LocalResult, LossName


class FedBSSSettings(Protocol):
    """The ``[learning.fedbss]`` keys this module reads."""

    @property
    def warmup_rounds(self) -> int: ...
    @property
    def epochs(self) -> int: ...
    @property
    def regrow(self) -> float: ...
    @property
    def steps(self) -> int: ...


class LocalPolicySettings(Protocol):
    """The ``[learning]`` keys this module reads (``peerd.daemon.config.LearningConfig`` has
    them). Declared here, not imported: learn sits below the daemon in the stage order
    (docs/architecture.md), so it states what it needs and the daemon passes its config in."""

    @property
    def local_policy(self) -> str: ...
    @property
    def fedbss(self) -> FedBSSSettings: ...


class LocalTraining:
    """A node's FedBSS policy and its warm-up state (one per daemon; rounds run one at a time)."""

    def __init__(self, policy: FedBSS) -> None:
        self.policy = policy
        self.state = WarmupState()
        self.last_was_curriculum = False

    @classmethod
    def of(cls, learning: LocalPolicySettings) -> LocalTraining | None:
        """From the config: None for ``plain`` (the round's default, untouched)."""
        if learning.local_policy == "plain":
            return None
        return cls(FedBSS(warmup_rounds=learning.fedbss.warmup_rounds,
                          epochs=learning.fedbss.epochs,
                          regrow_fraction=learning.fedbss.regrow,
                          step_budget=learning.fedbss.steps))

    def train(self, model: nn.Module, X: torch.Tensor, y: torch.Tensor, *, steps: int,
              batch_size: int, lr: float, rho: float, loss: LossName,
              generator: torch.Generator,
              anchor: Mapping[str, torch.Tensor] | None) -> LocalResult:
        result, self.state, self.last_was_curriculum = fedbss_local_update(
            model, X, y, state=self.state, policy=self.policy, steps=steps,
            batch_size=batch_size, lr=lr, rho=rho, loss=loss, generator=generator,
            anchor=anchor)
        return result
