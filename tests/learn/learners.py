"""Learners for the learner tests, imported by name in the worker process
(``entry = "tests.learn.learners:..."``): one that trains for real and one per way of failing.

Small on purpose (a 4 → 3 linear model, 64 generated rows): a worker round is then mostly
the process round trip.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch
from torch import nn

from peerd.learn.learner.contract import (
    EvalResult,
    FitConfig,
    FitResult,
    LearnerContext,
    Params,
)
from peerd.learn.tasks import FLEET_INIT_SEED

IN, OUT, ROWS = 4, 3, 64


def model() -> nn.Module:
    """The fleet's model (``[learner] model``)."""
    return nn.Linear(IN, OUT)


def _data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, IN, generator=g)
    w = torch.randn(IN, OUT, generator=torch.Generator().manual_seed(FLEET_INIT_SEED + 7))
    return x, (x @ w).argmax(dim=1)


class AdamWLearner:
    """A user's own loop: AdamW on generated data, the proximal term added to the loss."""

    def __init__(self, context: LearnerContext | None = None) -> None:
        # A class named as the entry is a factory: it is built with the node's context.
        part = 0 if context is None else context.node_config.get("partition-id", 0)
        self.x, self.y = _data(100 + (part if isinstance(part, int) else 0))
        self.model = model()
        self.default = "train" if context is None else str(context.node_config.get("do",
                                                                                  "train"))
        # torch's first optimizer step imports and initialises for seconds: here, under the
        # worker's start-up time, not under a test's short timeout_s.
        warm = model()
        opt = torch.optim.AdamW(warm.parameters())
        warm(self.x).sum().backward()
        opt.step()

    def fit(self, params: Params, anchor: Params, config: FitConfig) -> FitResult:
        self.model.load_state_dict(params)
        opt = torch.optim.AdamW(self.model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(config.seed)
        last = 0.0
        for _ in range(config.steps):
            idx = torch.randint(0, ROWS, (16,), generator=g)
            loss = nn.functional.cross_entropy(self.model(self.x[idx]), self.y[idx])
            prox = sum(((p - anchor[n]) ** 2).sum() for n, p in self.model.named_parameters())
            opt.zero_grad()
            (loss + config.rho / 2 * prox).backward()  # type: ignore[no-untyped-call]
            opt.step()
            last = float(loss.detach())
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return FitResult(params=state, num_examples=ROWS, metrics={"train_loss": last,
                                                                   "lr": 0.05})

    def evaluate(self, params: Params, config: FitConfig) -> EvalResult:
        self.model.load_state_dict(params)
        with torch.no_grad():
            out = self.model(self.x)
            loss = float(nn.functional.cross_entropy(out, self.y))
            acc = float((out.argmax(dim=1) == self.y).float().mean())
        return EvalResult(loss=loss, num_examples=ROWS, metrics={"accuracy": acc})


#: An object with fit and evaluate (``entry`` naming a learner itself).
learner = AdamWLearner()


def _raise(lr: AdamWLearner, params: Params, anchor: Params, config: FitConfig) -> FitResult:
    raise ValueError("bad batch\nsecond line never shown")


def _hang(lr: AdamWLearner, params: Params, anchor: Params, config: FitConfig) -> FitResult:
    time.sleep(3600)
    raise AssertionError("unreachable")


def _nan(lr: AdamWLearner, params: Params, anchor: Params, config: FitConfig) -> FitResult:
    out = AdamWLearner.fit(lr, params, anchor, config)
    bad = dict(out.params)
    bad["weight"] = bad["weight"].clone()
    bad["weight"][0, 0] = float("nan")
    return FitResult(bad, out.num_examples, out.metrics)


def _shape(lr: AdamWLearner, params: Params, anchor: Params, config: FitConfig) -> FitResult:
    out = AdamWLearner.fit(lr, params, anchor, config)
    return FitResult({**out.params, "bias": torch.zeros(OUT + 1)}, out.num_examples)


def _examples(lr: AdamWLearner, params: Params, anchor: Params,
              config: FitConfig) -> FitResult:
    out = AdamWLearner.fit(lr, params, anchor, config)
    return FitResult(out.params, -3, out.metrics)


def _kill(lr: AdamWLearner, params: Params, anchor: Params, config: FitConfig) -> FitResult:
    """SIGKILLs its own worker mid-fit."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def _write(lr: AdamWLearner, params: Params, anchor: Params, config: FitConfig) -> FitResult:
    """Writes into the ``params`` it is given: ``anchor`` (x̄) must not change with it."""
    for t in params.values():
        t.fill_(123.0)
    return FitResult({k: v.clone() for k, v in params.items()}, 1,
                     {"anchor_sum": float(sum(float(v.sum()) for v in anchor.values()))})


def _identity(lr: AdamWLearner, params: Params, anchor: Params,
              config: FitConfig) -> FitResult:
    """x̄ back as it came (the boundary's own cost, for measurements)."""
    return FitResult(params, 1)


BEHAVIOURS = {"train": AdamWLearner.fit, "identity": _identity, "raise": _raise, "hang": _hang,
              "nan": _nan,
              "shape": _shape, "examples": _examples, "kill": _kill, "write": _write}


class Scripted(AdamWLearner):
    """Does what ``run_config["do"]`` says, else the file ``PEERD_TEST_DO`` names, else its
    ``default`` (``[learner.node_config] do`` when built with a context): one worker shows
    every way of failing in turn."""

    def fit(self, params: Params, anchor: Params, config: FitConfig) -> FitResult:
        do = str(config.run_config.get("do", _from_file() or self.default))
        return BEHAVIOURS[do](self, params, anchor, config)


def _from_file() -> str | None:
    """What the file ``PEERD_TEST_DO`` names says, if it exists: a daemon test switches its
    worker's behaviour between rounds by writing it."""
    name = os.environ.get("PEERD_TEST_DO")
    if name is None or not Path(name).exists():
        return None
    return Path(name).read_text().strip() or None


def scripted(context: LearnerContext) -> Scripted:
    """A factory function (``entry`` naming a callable that is not a class)."""
    return Scripted(context)
