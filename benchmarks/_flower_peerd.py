"""peerd running examples/flower_app unchanged, for benchmarks/flower_vs_peerd.py.

N real ``Daemon`` objects in one process (tests/daemon/inprocfleet.py: each runs its own
round code, session handler, signing and cache; only the transport is an in-memory pipe,
every pair meets after each round, and the clock moves on one round interval a round), each
with ``[learner] kind = "flower"``: its worker runs the app's ClientApp in the Flower
environment, with ``partition-id`` i of ``num-partitions`` N, as Flower's simulation gives
its SuperNodes. That makes the rounds synchronous, like FedAvg's, so that accuracy per round
compares like with like; a real peerd mesh is asynchronous (each node on its own clock).

Per round r, for every node: the central accuracy (the ServerApp's held-out set, the app's
own ``test``) of x̄ — the blend of what the node cached after round r − 1, which peerd hands
to the ClientApp as the round's "global" model — and of the model its ClientApp returned,
and the ClientApp's own evaluation of that model. Recording x̄ wraps the worker's ``fit``
to copy what it is given; nothing it computes changes.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from peerd.daemon.config_learner import LearnerConfig
from peerd.learn.learner.contract import FitConfig, FitResult
from peerd.learn.learner.worker import WorkerLearner

#: peerd's settings for the comparison: C holds every peer, τ_max never expires one within
#: the run (the clock moves 10 s a round), α weighs by example count as FedAvg does, ρ = 0
#: (FedAvg has no proximal term), and the learning rate the ServerApp sends (0.1).
LEARNING: dict[str, Any] = {"capacity": 10, "tau_max": 600.0, "alpha": "examples",
                            "rho": 0.0, "lr": 0.1, "round_interval_s": 10.0}
#: What [tool.flwr.app.config] in the app's pyproject.toml gives Flower's runtime.
RUN_CONFIG: dict[str, str | int | float | bool] = {
    "local-epochs": 2, "batch-size": 32, "learning-rate": 0.1, "fraction-evaluate": 1.0}


def _central(app: Path) -> Callable[[dict[str, torch.Tensor]], float]:
    """The ServerApp's ``global_evaluate``: the app's ``test`` on its held-out set."""
    sys.path.insert(0, str(app))
    task = importlib.import_module("flowerapp.task")  # the app's own
    data = task.load_centralized_dataset()

    def accuracy(params: dict[str, torch.Tensor]) -> float:
        net = task.Net()
        net.load_state_dict(params)
        return float(task.test(net, data, torch.device("cpu"))[1])

    return accuracy


def run_peerd(app: Path, work: Path, flower_python: Path, nodes: int,
              rounds: int) -> dict[str, Any]:
    """``rounds`` synchronous rounds of ``nodes`` daemons; per-round accuracies per node."""
    from tests.daemon.inprocfleet import Fleet, fleet_configs

    accuracy = _central(app)
    # The worker runs under the Flower interpreter, which does not inherit our sys.path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(app)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    cfgs = [dataclasses.replace(c, learner=LearnerConfig(
        kind="flower", entry="flowerapp.client_app:app", model="flowerapp.task:Net",
        device="cpu", timeout_s=600.0, python=str(flower_python),
        run_config={**RUN_CONFIG, "num-server-rounds": rounds},
        node_config={"partition-id": i, "num-partitions": nodes}))
        for i, c in enumerate(fleet_configs(work, nodes, learning=LEARNING))]
    given: dict[int, list[dict[str, torch.Tensor]]] = {}
    fit = WorkerLearner.fit

    def recording_fit(self: WorkerLearner, params: Any, anchor: Any,
                      config: FitConfig) -> FitResult:
        given.setdefault(id(self), []).append({k: v.detach().clone() for k, v in params.items()})
        return fit(self, params, anchor, config)

    WorkerLearner.fit = recording_fit  # type: ignore[method-assign]
    fleet = Fleet(cfgs)
    try:
        workers = [id(d.mode.worker) for d in fleet.daemons]  # type: ignore[attr-defined]
        trained: list[list[float]] = [[] for _ in range(nodes)]
        own_eval: list[list[float | None]] = [[] for _ in range(nodes)]
        round_s = []
        # One round more than Flower's: its fits are not counted, only the x̄ they are given
        # (the blend of round `rounds`' models, as Flower's last global model is).
        for r in range(rounds + 1):
            t0 = time.perf_counter()
            fleet.round()
            round_s.append(round(time.perf_counter() - t0, 2))
            if r < rounds:
                for i, d in enumerate(fleet.daemons):
                    trained[i].append(accuracy({k: v.detach().clone()
                                                for k, v in d.model.state_dict().items()}))
                    own_eval[i].append(d.metrics.val_accuracy)
                fleet.sweep()
        failed = [dict(d.mode.learner_stats.failed) for d in fleet.daemons]  # type: ignore[attr-defined]
    finally:
        WorkerLearner.fit = fit  # type: ignore[method-assign]
        for d in fleet.daemons:
            d.mode.close()  # type: ignore[attr-defined]
    blend = [[accuracy(p) for p in given[w]] for w in workers]
    return {"settings": {**LEARNING, "nodes": nodes, "rounds": rounds,
                         "run_config": RUN_CONFIG},
            "blend_accuracy": blend, "trained_accuracy": trained,
            "client_eval_acc": own_eval, "learner_failed": failed,
            "round_s": round_s[:rounds]}
