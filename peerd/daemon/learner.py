"""``[learner]`` at start-up: the worker of a python or flower learner, started before the
daemon is ready, and every failure to get there as one start-up line (exit status 2).

The device (every kind's, the builtin one's too) is checked here, not in the config loader
(torch knows it; the loader must not import torch). ``kind = "external"`` starts no worker:
its socket (:mod:`peerd.daemon.external`) is checked here and bound with the control socket.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from torch import nn

from peerd.control.server import MAX_SOCKET_PATH_LEN, ControlError, check_socket_free
from peerd.daemon.config import Config
from peerd.daemon.external import ExternalSide
from peerd.daemon.startup import DaemonError
from peerd.learn.learner.check import schema_of
from peerd.learn.learner.contract import LearnerContext, LearnerError, LearnerKind
from peerd.learn.learner.external import learner_socket
from peerd.learn.learner.fleet import DeviceError, resolve_device
from peerd.learn.learner.stats import LearnerStats
from peerd.learn.learner.wire import schema_to_json
from peerd.learn.learner.worker import WorkerLearner, WorkerSpec

log = logging.getLogger(__name__)

#: The buffers' folder inside the state directory (the state lock makes it this daemon's).
BUFFER_DIR = "learner"


def learner_device(cfg: Config) -> str:
    """``[learner] device`` resolved on this machine (a missing device: DaemonError)."""
    try:
        return resolve_device(cfg.learner.device)
    except DeviceError as exc:
        raise DaemonError(str(exc)) from None


def clear_buffers(folder: Path) -> None:
    """Buffers a previous run left (it was killed before it could remove them)."""
    if folder.is_dir():
        for stale in folder.glob("learner-*"):
            stale.unlink(missing_ok=True)


def open_external(cfg: Config, model: nn.Module, node_id: str,
                  clock: Callable[[], float]) -> tuple[ExternalSide, LearnerStats]:
    """``kind = "external"``: the learner socket's side, checked now (a path too long, a live
    daemon on it: one start-up line), bound later with the control socket."""
    lc, learning = cfg.learner, cfg.learning
    device = learner_device(cfg)
    path = learner_socket(cfg.node.state_dir)
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_LEN:
        raise DaemonError(f'[learner] kind = "external": the learner socket {path} is longer '
                          f"than {MAX_SOCKET_PATH_LEN} bytes; choose a shorter [node] state_dir")
    try:
        check_socket_free(path)
    except ControlError as exc:
        raise DaemonError(f"[learner] kind = \"external\": {exc.message}") from None
    schema = schema_of(model.state_dict())
    hello = {"kind": LearnerKind.EXTERNAL.value, "node_id": node_id, "device": device,
             "schema": schema_to_json(schema), "rho": learning.rho,
             "steps": learning.local_steps, "lr": learning.lr,
             "batch_size": learning.batch_size, "max_examples": cfg.validation.max_examples,
             "run_config": dict(lc.run_config), "node_config": dict(lc.node_config)}
    stats = LearnerStats(kind=lc.kind, entry=None, device=device)
    side = ExternalSide(path=path, group=cfg.node.socket_group, model=model, schema=schema,
                        hello=hello, max_examples=cfg.validation.max_examples, stats=stats,
                        clock=clock)
    return side, stats


def open_worker(cfg: Config, model: nn.Module, node_id: str) -> tuple[WorkerLearner | None,
                                                                      LearnerStats]:
    """The started worker of ``[learner]`` (None for the builtin and external learners) and
    its stats."""
    lc = cfg.learner
    if not lc.runs_worker:
        # The builtin learner trains on it too (peerd.learn.ondevice); checked here likewise.
        return None, LearnerStats(kind=lc.kind, entry=None, device=learner_device(cfg))
    assert lc.entry is not None  # the loader requires it for these kinds
    device = learner_device(cfg)
    folder = cfg.node.state_dir / BUFFER_DIR
    clear_buffers(folder)
    spec = WorkerSpec(
        kind=LearnerKind(lc.kind), entry=lc.entry,
        context=LearnerContext(node_id=node_id, device=device, node_config=lc.node_config,
                               run_config=lc.run_config),
        schema=schema_of(model.state_dict()), buffer_dir=folder, timeout_s=lc.timeout_s,
        torch_threads=cfg.node.torch_threads, max_examples=cfg.validation.max_examples,
        python=lc.python)
    worker = WorkerLearner(spec)
    try:
        worker.start()
    except LearnerError:
        worker.close()
        raise DaemonError(f"[learner] entry {lc.entry}: the {lc.kind} learner's worker "
                          f"{worker.last_crash}") from None
    return worker, LearnerStats(kind=lc.kind, entry=lc.entry, device=device)
