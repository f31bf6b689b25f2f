"""What a daemon with a learner of the user's builds in its own process: the fleet's model
(``[learner] model``) and the device it hands the learner (``[learner] device``).

The model is the one piece of user code the daemon itself runs: it has to hold the model it
blends, signs and gossips. The callable is imported and called once at start-up, under the
fleet-wide seed (:data:`peerd.learn.tasks.FLEET_INIT_SEED`) and without touching the
caller's global RNG, exactly as the tasks build theirs: every node must start from the same
parameters, or the blend averages unrelated coordinates. It is never trained here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
from torch import nn

from peerd.core.local_update import LossName
from peerd.learn.tasks import FLEET_INIT_SEED, TaskData, TaskError


class DeviceError(ValueError):
    """``[learner] device`` names a device this machine does not have."""


def resolve_device(spec: str) -> str:
    """``auto`` → ``cuda:0`` when torch sees a CUDA device, else ``cpu``; ``cuda`` →
    ``cuda:0``; anything asked for that is not there is a :class:`DeviceError`."""
    if spec == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return spec
    if spec == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceError('[learner] device: "mps" asked for, but torch sees no MPS '
                              "device on this machine")
        return spec
    index = int(spec.partition(":")[2] or 0)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index >= count:
        have = "no CUDA device" if count == 0 else f"{count} CUDA device{'s' * (count > 1)}"
        raise DeviceError(f'[learner] device: "{spec}" asked for, but torch sees {have} on '
                          "this machine")
    return f"cuda:{index}"


def build_fleet_model(spec: str) -> nn.Module:
    """``package.module:callable`` called with no arguments under the fleet seed."""
    module_name, _, attr = spec.partition(":")
    # The import inside the fork too: a module that draws random numbers when imported
    # (a model built at import time) leaves the daemon's global RNG as it was.
    with torch.random.fork_rng(devices=[]):
        try:
            factory = importlib.import_module(module_name)
            for part in attr.split("."):
                factory = getattr(factory, part)
        except (ImportError, AttributeError) as exc:
            raise TaskError(f"[learner] model {spec!r}: cannot load it: {exc}") from None
        if not callable(factory):
            raise TaskError(f"[learner] model {spec!r} is not callable")
        torch.manual_seed(FLEET_INIT_SEED)
        try:
            model = factory()
        except Exception as exc:  # noqa: BLE001 - the user's constructor: one start-up line
            raise TaskError(f"[learner] model {spec!r} raised {type(exc).__name__}: "
                            f"{' '.join(str(exc).split())[:200]}") from None
    if not isinstance(model, nn.Module):
        raise TaskError(f"[learner] model {spec!r} returned {type(model).__name__}, "
                        "not an nn.Module")
    return model.cpu()  # the daemon blends and signs on the CPU; the learner moves its copy


@dataclass
class LearnerTask:
    """The daemon's task when a learner of the user's trains: it names the model and has no
    data (the learner reads its own, in its worker). Nothing calls :meth:`data` in weight
    mode with such a learner (peerd.learn.trainer.run_round)."""

    model_spec: str
    name: str = "learner"
    loss: LossName = "cross_entropy"

    def model(self) -> nn.Module:
        return build_fleet_model(self.model_spec)

    def data(self) -> TaskData:
        raise TaskError("the learner reads its own data; the daemon has none")
