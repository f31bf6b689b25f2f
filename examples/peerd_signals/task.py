"""Classifying short signals (sine, square, noise) stored one file per capture.

The data folder (``$PEERD_SIGNALS_DIR``) holds one sub-folder per class, one text file per
capture, one number per line::

    data/
      sine/    0001.txt  0002.txt ...
      square/  ...
      noise/   ...

Every node of a fleet points at its own folder (its own captures); the class list and the
capture length are fixed here, so every node builds the same model. peerd calls
:func:`task` once at start-up, :meth:`SignalTask.model` once, and :meth:`SignalTask.data`
every round (captures that arrive meanwhile are used from the next round on).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from peerd.core.local_update import LossName
from peerd.learn.tasks import TaskData, TaskError

#: Environment variable naming the data folder (peerd passes a user task no arguments:
#: the unit's ``Environment=`` line, or the shell, sets it).
DATA_ENV = "PEERD_SIGNALS_DIR"
#: Class names = sub-folder names, in label order. Fixed: the model's output size.
CLASSES = ("sine", "square", "noise")
#: Samples per capture. Fixed: every node's model sees the same input width.
LENGTH = 64
#: Bounds on what is read, checked before reading: a runaway folder must not exhaust memory.
MAX_FILES = 100_000
MAX_FILE_BYTES = 64 * 1024
#: The whole fleet's initialisation seed (the blend averages a shared starting point).
INIT_SEED = 0


class SignalNet(nn.Module):
    """Two 1-D convolutions, a mean over time, a linear classifier: [B, LENGTH] -> [B, 3]."""

    def __init__(self, channels: int = 8, classes: int = len(CLASSES)) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, kernel_size=5, padding=2)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=5, padding=2)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv1(x.unsqueeze(1)))
        h = torch.relu(self.conv2(h))
        return self.head(h.mean(dim=2))  # type: ignore[no-any-return]


def read_capture(path: Path) -> list[float]:
    """One capture file: LENGTH numbers, one per line (TaskError otherwise)."""
    if path.stat().st_size > MAX_FILE_BYTES:
        raise TaskError(f"{path}: over {MAX_FILE_BYTES} bytes, not a capture")
    try:
        values = [float(line) for line in path.read_text().split()]
    except ValueError as exc:
        raise TaskError(f"{path}: {exc}") from None
    if len(values) != LENGTH:
        raise TaskError(f"{path}: {len(values)} values, a capture has {LENGTH}")
    return values


def _held_out(path: Path) -> bool:
    # 1 capture in 5 validates, chosen by a stable hash of its name: the same file stays
    # on the same side when the folder is read again next round.
    return hashlib.blake2b(path.name.encode(), digest_size=1).digest()[0] < 256 // 5


@dataclass
class SignalTask:
    """peerd's task interface: ``name``, ``loss``, ``model()`` and ``data()``."""

    directory: Path
    name: str = "peerd_signals"
    loss: LossName = "cross_entropy"

    def model(self) -> nn.Module:
        # nn init draws from torch's global generator: seed it inside a fork, so every node
        # starts from the same weights and the caller's RNG state is left as it was.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(INIT_SEED)
            return SignalNet()

    def data(self) -> TaskData:
        files = [(label, path) for label, name in enumerate(CLASSES)
                 for path in sorted((self.directory / name).glob("*.txt"))]
        if not files:
            raise TaskError(f"no captures in {self.directory}/{{{','.join(CLASSES)}}}/*.txt")
        if len(files) > MAX_FILES:
            raise TaskError(f"{len(files)} captures in {self.directory}, over {MAX_FILES}")
        X = torch.tensor([read_capture(path) for _, path in files], dtype=torch.float32)
        y = torch.tensor([label for label, _ in files], dtype=torch.long)
        held = torch.tensor([_held_out(path) for _, path in files])
        if bool(held.all()) or not bool(held.any()):  # too few files to split: use all
            return TaskData(X, y, X, y)
        return TaskData(X[~held], y[~held], X[held], y[held])


def task() -> SignalTask:
    """What ``[task] name = "peerd_signals.task:task"`` calls (once, at start-up)."""
    directory = os.environ.get(DATA_ENV)
    if not directory:
        raise TaskError(f"set {DATA_ENV} to the folder of captures (docs/tasks.md)")
    path = Path(directory)
    if not path.is_dir():
        raise TaskError(f"{DATA_ENV}={directory} is not a directory")
    return SignalTask(path)
