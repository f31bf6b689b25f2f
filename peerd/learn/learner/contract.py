"""The learner contract: what peerd asks of the code that trains a node's model.

Weight mode's local step (``[learning] mode = "weights"``) is a learner's :meth:`Learner.fit`:
peerd blends the cache into x̄ (the anchor of the proximal term ρ/2‖x − x̄‖²), hands x̄ to
the learner as ``params`` and ``anchor``, and signs and gossips what the learner gives back.
How the learner trains — its loop, optimizer, scheduler, data pipeline, device — is its own
business (Flower's ``NumPyClient.fit`` and ``ClientApp`` ``@app.train()`` have the same shape).

Parameters cross the contract as a name → tensor mapping in the fleet's schema: the keys,
shapes and dtypes of the model's ``state_dict()``, CPU tensors, contiguous. A learner must
give back the same keys, shapes and dtypes, finite values and a non-negative example count;
anything else refuses that round with a named reason (:class:`Refusal`), and nothing is
published and nothing in the cache changes (:mod:`peerd.learn.learner.check`).

``[learner] kind`` chooses who implements the contract:

* ``builtin`` — peerd's own proximal SGD (:mod:`peerd.learn.trainer`), in the daemon's
  process, bit for bit what peerd did before learners existed;
* ``python`` — a user's object or factory (``entry = "pkg.module:attr"``) with ``fit`` and
  ``evaluate``, run in a worker process;
* ``flower`` — an unchanged Flower ``ClientApp`` or ``client_fn``, called as Flower's runtime
  would call it, in a worker process;
* ``external`` — a training process the user runs attaches over a local socket.

Torch is imported for the tensor type only; this module holds no behaviour.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

#: A model's parameters and buffers by ``state_dict()`` name, in the fleet's schema.
Params = Mapping[str, torch.Tensor]
#: A metric a learner reports: a number (bounded in count and name length by
#: :mod:`peerd.learn.learner.check`, so a learner cannot create unbounded series).
Metrics = Mapping[str, float]
#: A scalar a learner's configuration may carry (Flower's ``ConfigRecord`` values).
Scalar = bool | int | float | str


class LearnerKind(enum.StrEnum):
    """``[learner] kind``."""

    BUILTIN = "builtin"
    PYTHON = "python"
    FLOWER = "flower"
    EXTERNAL = "external"


@dataclass(frozen=True, slots=True)
class FitConfig:
    """What one round asks of :meth:`Learner.fit` (and :meth:`Learner.evaluate`)."""

    #: The node's round number, from 1 (Flower's ``"server-round"``).
    round: int
    #: ρ of the proximal term ρ/2‖x − x̄‖², x̄ = ``anchor`` (Flower's ``"proximal-mu"``).
    rho: float
    #: The step budget K (``[learning] local_steps``): mini-batch steps this round.
    steps: int
    #: A per-round seed (the node id and round hashed): for batch order and augmentation.
    seed: int
    #: ``[learner] device``, resolved (``"cpu"``, ``"cuda:0"``, …).
    device: str
    #: ``[learning] batch_size`` and ``lr``: the built-in learner's; others may ignore them.
    batch_size: int
    lr: float
    #: ``[learner.run_config]``: the user's own settings (Flower's ``Context.run_config``).
    run_config: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FitResult:
    """What :meth:`Learner.fit` gives back."""

    #: The trained model, in the fleet's schema (the same keys, shapes and dtypes as given).
    params: Params
    #: How many local examples the round trained on: α's weight for this model at peers.
    num_examples: int
    #: The learner's own numbers for the round (train loss, lr, …): shown in status, the
    #: round log and Prometheus.
    metrics: Metrics = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EvalResult:
    """What :meth:`Learner.evaluate` gives back: the model's loss on the learner's held-out
    data and how many examples that was (``metrics["accuracy"]``, when present, is the
    status's validation accuracy)."""

    loss: float
    num_examples: int
    metrics: Metrics = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LearnerContext:
    """What a learner factory is built with (``entry`` names a callable that is not itself a
    :class:`Learner`: it is called once per worker with this and must return one)."""

    #: The node's peer id (12D3KooW…).
    node_id: str
    #: ``[learner] device``, resolved.
    device: str
    #: ``[learner.node_config]`` (Flower's ``Context.node_config``: ``"partition-id"``, …).
    node_config: Mapping[str, Scalar] = field(default_factory=dict)
    #: ``[learner.run_config]`` (Flower's ``Context.run_config``).
    run_config: Mapping[str, Scalar] = field(default_factory=dict)


@runtime_checkable
class Learner(Protocol):
    """The learner contract. Both calls may run long and may use any device; neither may
    keep references to ``params`` or ``anchor`` past its return (peerd reuses the memory)."""

    def fit(self, params: Params, anchor: Params, config: FitConfig) -> FitResult:
        """Train from ``params`` (= x̄ = ``anchor``; the two differ only by who may write
        them: ``anchor`` is read-only) and return the trained model."""
        ...

    def evaluate(self, params: Params, config: FitConfig) -> EvalResult:
        """The loss of ``params`` on held-out data."""
        ...


class Refusal(enum.StrEnum):
    """Why a learner's round was refused: the ``reason`` label of ``learner_failed``.

    A closed set, so the counter's series are bounded whatever a learner does."""

    #: ``fit`` or ``evaluate`` raised.
    RAISED = "raised"
    #: It ran past ``[learner] timeout_s`` and was cut.
    TIMEOUT = "timeout"
    #: The worker process died (a signal, a segfault, out of memory) or could not start.
    CRASHED = "crashed"
    #: Keys, shapes or dtypes differ from the fleet's schema.
    SCHEMA = "schema"
    #: A NaN or an infinity in the parameters, the loss or a metric.
    NON_FINITE = "non_finite"
    #: A negative (or non-integer) example count.
    EXAMPLES = "examples"
    #: A result of the wrong type, or metrics that are not a small map of names to numbers.
    MALFORMED = "malformed"


class LearnerError(Exception):
    """A learner's round failed: ``reason`` names why, the message says what was seen."""

    def __init__(self, reason: Refusal, detail: str) -> None:
        super().__init__(f"learner {reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
