"""`peerd sim --engine ray`: a round's training shards spread over Ray actors.

Only training leaves the driver. Mobility, contacts, cache merges, blends, evaluation and every
random draw stay in :mod:`peerd.sim.runner`, and a shard is the same computation wherever it
runs (:mod:`peerd.sim.engine`), so the summary is byte for byte the local engine's for any
number of workers. Each actor receives the run's :class:`~peerd.sim.engine.TrainSetup` (model
architecture, training set, partition) once, through Ray's object store, so a worker machine
needs peerd installed but not the datasets.

Ray is an optional extra (``pip install 'peerd[ray]'``): it is imported only when this engine
starts, and :func:`ray_available` lets the CLI refuse ``--engine ray`` in one line without it.
This module must not decide anything of a round, nor draw random numbers.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
from dataclasses import replace
from types import ModuleType
from typing import Any

import numpy as np
import torch

from peerd.sim.engine import TrainSetup, TrainTask, shard_bounds, shard_threads, train_shard

INSTALL_HINT = "--engine ray needs Ray: pip install 'peerd[ray]'"


def ray_available() -> bool:
    """Whether ``import ray`` would find a module (nothing is imported)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False


def _import_ray() -> ModuleType:
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise RuntimeError(INSTALL_HINT) from exc


def _probe(address: str, timeout: float = 5.0) -> None:
    """Refuse a ``HOST:PORT`` nothing listens on: Ray itself retries one for minutes."""
    if address == "auto" or "://" in address:
        return  # Ray resolves these itself
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RuntimeError(f"--address must be HOST:PORT, auto or ray://HOST:PORT, "
                           f"got {address!r}")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise RuntimeError(f"cannot reach Ray at {address}: {exc}") from exc


class ShardWorker:
    """One Ray actor: the run's setup, and each shard it is handed trained single-threaded."""

    def __init__(self, setup: TrainSetup) -> None:
        torch.set_num_threads(1)
        # The object store hands out read-only arrays; torch wants to own writable ones.
        self._setup = replace(setup, agent_idx=[np.array(ix) for ix in setup.agent_idx])

    def train(self, task: TrainTask, lo: int,
              rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with shard_threads():
            new, losses = train_shard(self._setup, task, lo, torch.from_numpy(rows.copy()))
        return new.numpy(), losses.numpy()


class RayEngine:
    """Shards over ``workers`` actors of a Ray cluster, round-robin, results in shard order.

    ``address``: an existing cluster (``ray start --head`` printed it; ``auto`` finds a local
    one); empty: a Ray already initialised in this process, else a new local one. ``workers``
    0: one actor per CPU the cluster has. Use as a context manager: the actors (and a Ray this
    engine started) go away on exit."""

    name = "ray"

    def __init__(self, address: str = "", workers: int = 0) -> None:
        if workers < 0:
            raise ValueError("workers must be >= 0")
        self._ray = _import_ray()
        self._started = False
        if address:
            _probe(address)  # also when a Ray is up in this process: a bad flag is still bad
        if not self._ray.is_initialized():
            # Opt in to Ray's coming default now (CPU only here), which also silences its
            # FutureWarning about overriding CUDA_VISIBLE_DEVICES on every start.
            os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address:
                kwargs["address"] = address
            elif workers:
                kwargs["num_cpus"] = workers
            try:
                self._ray.init(**kwargs)
            except Exception as exc:  # Ray raises several kinds (connection, timeout, value)
                where = f" at {address}" if address else ""
                raise RuntimeError(f"cannot start or join Ray{where}: {exc}") from exc
            self._started = True
        cpus = int(self._ray.cluster_resources().get("CPU", 1))
        self._workers = workers or max(cpus, 1)
        self._actors: list[Any] = []
        self._shard_agents = 1

    @property
    def workers(self) -> int:
        return self._workers

    def load(self, setup: TrainSetup, shard_agents: int) -> None:
        self._kill()
        ref = self._ray.put(setup)  # one copy in the object store, read by every actor
        remote = self._ray.remote(num_cpus=1)(ShardWorker)
        self._actors = [remote.remote(ref) for _ in range(self._workers)]
        self._shard_agents = shard_agents

    def train(self, task: TrainTask,
              matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._actors:
            raise RuntimeError("RayEngine.train before load")
        bounds = shard_bounds(matrix.shape[0], self._shard_agents)
        pending = [
            self._actors[i % len(self._actors)].train.remote(task, lo, matrix[lo:hi].numpy())
            for i, (lo, hi) in enumerate(bounds)
        ]
        new = torch.empty_like(matrix)
        losses = torch.empty(matrix.shape[0])
        # Results arrive as read-only views of the object store: copied in through numpy.
        for (lo, hi), (rows, loss) in zip(bounds, self._ray.get(pending), strict=True):
            new.numpy()[lo:hi] = rows
            losses.numpy()[lo:hi] = loss
        return new, losses

    def _kill(self) -> None:
        for actor in self._actors:
            self._ray.kill(actor)
        self._actors = []

    def close(self) -> None:
        self._kill()
        if self._started:
            self._ray.shutdown()
            self._started = False

    def __enter__(self) -> RayEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
