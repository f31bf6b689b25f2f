"""The fleet's model, which ``[learner] model = "external_loop.model:Net"`` names: the daemon
builds it seeded (every node starts from the same point) and holds, blends and signs it."""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    """A small MLP over scikit-learn's 8x8 digits (64 pixels, 10 classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return out
