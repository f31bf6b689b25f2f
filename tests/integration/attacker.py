"""A poisoning member for integration tests: a user task (``[task] name =
"tests.integration.attacker:task"``) whose daemon trains like any other but signs and
publishes the sign-flipped, scaled model −s·x with its valid key.

Not an attack mode of the daemon: only the model's ``state_dict`` (what the daemon reads to
sign and publish) is wrapped, so the entry has the fleet's schema and passes every check an
honest entry passes. The attacker trains on the whole digits training set (its data does not
matter) and should run with ``rho = 0``: its own x̄ is the flipped published entry.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from peerd.learn.tasks import DatasetTask, TaskData

#: −s·x is published; s from ``$PEERD_ATTACK_SCALE`` (default 3).
SCALE_ENV = "PEERD_ATTACK_SCALE"


def sign_flipped(model: nn.Module, scale: float) -> nn.Module:
    """``model``, whose ``state_dict()`` returns −scale × its float tensors (copies)."""
    honest = model.state_dict

    def flipped(*args: Any, **kwargs: Any) -> OrderedDict[str, torch.Tensor]:
        return OrderedDict((k, (-scale * v).detach() if v.is_floating_point() else v)
                           for k, v in honest(*args, **kwargs).items())

    model.state_dict = flipped  # type: ignore[assignment,method-assign]
    return model


class SignFlipTask:
    """The digits task, publishing sign-flipped models."""

    def __init__(self) -> None:
        self._inner = DatasetTask("digits", "iid", 0, 1, 0)
        self.scale = float(os.environ.get(SCALE_ENV, "3"))

    @property
    def name(self) -> str:
        return "sign-flip attacker"

    @property
    def loss(self) -> Any:
        return self._inner.loss

    def model(self) -> nn.Module:
        return sign_flipped(self._inner.model(), self.scale)

    def data(self) -> TaskData:
        return self._inner.data()


def task() -> SignFlipTask:
    return SignFlipTask()
