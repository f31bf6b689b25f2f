"""The flower kind through the daemon's worker: examples/flower_app, unchanged, trains in a
worker process under an interpreter of its own (``[learner] python``: Flower's pins do not
resolve beside peerd's, so it lives in another environment — scripts/setup makes
``.venv-flower``; CI runs this file from the main environment)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from peerd.learn.learner.check import schema_of
from peerd.learn.learner.contract import FitConfig, LearnerContext, LearnerKind
from peerd.learn.learner.worker import WorkerLearner, WorkerSpec

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "flower_app"
#: The Flower environment: $PEERD_FLOWER_PYTHON, else the one scripts/setup makes.
PYTHON = os.environ.get("PEERD_FLOWER_PYTHON", str(ROOT / ".venv-flower" / "bin" / "python"))


def _has_flower(python: str) -> bool:
    if not os.access(python, os.X_OK):
        return False
    probe = subprocess.run([python, "-c", "import flwr, peerd.learn.learner.child"],
                           capture_output=True, check=False, timeout=120)
    return probe.returncode == 0


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not _has_flower(PYTHON),
                                 reason=f"no Flower environment at {PYTHON} (scripts/setup)")]


def test_the_flower_example_trains_in_a_worker_of_its_own_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(APP))  # the daemon builds the model: [learner] model
    from flowerapp.task import Net  # type: ignore[import-not-found]

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        start = {k: v.detach().clone() for k, v in Net().state_dict().items()}
    spec = WorkerSpec(kind=LearnerKind.FLOWER, entry="flowerapp.client_app:app",
                      context=LearnerContext(node_id="12D3KooWflower", device="cpu",
                                             node_config={"partition-id": 0,
                                                          "num-partitions": 2},
                                             run_config={"local-epochs": 1, "batch-size": 32}),
                      schema=schema_of(start), buffer_dir=tmp_path / "buffers",
                      timeout_s=120.0, python=PYTHON, env={"PYTHONPATH": str(APP)})
    worker = WorkerLearner(spec)
    try:
        config = FitConfig(round=1, rho=0.0, steps=10, seed=3, device="cpu", batch_size=32,
                           lr=0.1)
        before = worker.evaluate(start, config)
        fit = worker.fit(start, start, config)
        after = worker.evaluate(fit.params, config)
    finally:
        worker.close()
    assert fit.num_examples > 0
    assert set(fit.params) == set(start)
    assert any(not torch.equal(fit.params[k], start[k]) for k in start)
    assert after.loss < before.loss
