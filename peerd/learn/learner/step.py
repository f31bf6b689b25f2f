"""A learner as weight mode's local step: what :mod:`peerd.learn.trainer` does instead of its
own proximal SGD when ``[learner] kind`` is not ``builtin``.

After the blend, the model's tensors are x̄: they go to :meth:`Learner.fit` as ``params`` and
``anchor``; what comes back is checked against the fleet's schema
(:mod:`peerd.learn.learner.check`) and copied into the model in place, so the round's
output is the model's own tensors as with the built-in learner. Then the trained model is
evaluated by the learner. Any :class:`LearnerError` is kept as the round's failure (the
round then publishes nothing); the model is left as x̄ when ``fit`` failed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from peerd.learn.learner.check import FleetSchema, check_eval, check_fit, raised
from peerd.learn.learner.contract import (
    EvalResult,
    FitConfig,
    FitResult,
    Learner,
    LearnerError,
    Params,
    Scalar,
)

#: Metric names a learner may use for its training loss (the status's ``train_loss``).
TRAIN_LOSS_NAMES = ("train_loss", "loss")


@dataclass(frozen=True, slots=True)
class LearnerRound:
    """What a round needs to train with a learner (``RoundInput.learner``)."""

    learner: Learner
    schema: FleetSchema
    #: The node's round (FitConfig.round: from 1).
    round: int
    device: str
    run_config: Mapping[str, Scalar] = field(default_factory=dict)
    #: The own model's example count for α before it trains (the last fit's).
    own_examples: int = 1
    #: The most examples peers accept in an entry ([validation] max_examples).
    max_examples: int | None = None


@dataclass(frozen=True, slots=True)
class Fitted:
    """One learner round's outcome: the checked fit (None if it failed) and the failure."""

    fit: FitResult | None
    failure: LearnerError | None

    @property
    def train_loss(self) -> float:
        if self.fit is None:
            return math.nan
        for name in TRAIN_LOSS_NAMES:
            if name in self.fit.metrics:
                return float(self.fit.metrics[name])
        return math.nan


def fit_config(lr: LearnerRound, *, rho: float, steps: int, seed: int, batch_size: int,
               learning_rate: float) -> FitConfig:
    return FitConfig(round=lr.round, rho=rho, steps=steps, seed=seed, device=lr.device,
                     batch_size=batch_size, lr=learning_rate, run_config=lr.run_config)


def fit_into(model_params: Mapping[str, torch.Tensor], lr: LearnerRound,
             config: FitConfig) -> Fitted:
    """``fit`` from ``model_params`` (the model's own tensors, = x̄) and, if the result
    passes the checks, the trained tensors copied into them."""
    try:
        result = check_fit(lr.learner.fit(model_params, model_params, config), lr.schema,
                           max_examples=lr.max_examples)
        with torch.no_grad():
            for name, dst in model_params.items():
                dst.copy_(result.params[name])
    except LearnerError as exc:
        return Fitted(None, exc)
    except Exception as exc:  # noqa: BLE001 - an in-process learner's own code raised
        return Fitted(None, raised(exc))
    # The result's tensors may be the worker's buffer (valid until its next call): what
    # evaluation reads, the round's output is the model's tensors.
    return Fitted(result, None)


def evaluate_with(lr: LearnerRound, params: Params, config: FitConfig) -> EvalResult:
    """``evaluate`` of the trained model, checked (a :class:`LearnerError` otherwise)."""
    try:
        result = lr.learner.evaluate(params, config)
    except LearnerError:
        raise
    except Exception as exc:  # noqa: BLE001 - an in-process learner's own code raised
        raise raised(exc) from None
    return check_eval(result)
