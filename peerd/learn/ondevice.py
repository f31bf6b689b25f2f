"""The built-in learner's training copy on a device other than the CPU (``[learner] device``).

The daemon's model stays on the CPU: it is what the round blends into, what the daemon signs,
spills and gossips. Training and evaluation run on a copy of it kept on the device for the
daemon's life: each round loads x̄ into the copy, trains it there (the model, every batch
and x̄ for the proximal term on the device) and copies the result back into the CPU model.
On the CPU none of this exists: the round trains the daemon's model itself, as it always has.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import nn


class DeviceCopy:
    """A device-resident copy of ``model`` (same architecture, same state_dict names).

    The daemon makes one only for a device other than the CPU; on the CPU it is the same
    round through a second copy (what the tests compare bit for bit with the plain round)."""

    def __init__(self, model: nn.Module, device: str) -> None:
        self.device = torch.device(device)
        self.model = copy.deepcopy(model).to(self.device)

    def load(self, model: nn.Module) -> None:
        """x̄ (the CPU model, parameters and buffers) into the copy."""
        with torch.no_grad():
            src = model.state_dict()
            for name, dst in self.model.state_dict().items():
                dst.copy_(src[name], non_blocking=True)

    def store(self, model: nn.Module) -> None:
        """The trained copy back into the CPU model, in place."""
        with torch.no_grad():
            src = self.model.state_dict()
            for name, dst in model.state_dict().items():
                dst.copy_(src[name])

    def anchor(self, anchor: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """x̄'s trainable parameters on the device (the proximal term's pull), from the
        CPU mapping the round holds (the published entry, or the spilled blend)."""
        return {n: anchor[n].to(self.device, non_blocking=True)
                for n, p in self.model.named_parameters() if p.requires_grad}

    def rows(self, X: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The task's inputs and targets on the device (re-read every round)."""
        return X.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
