"""The simulator's per-round local drift: mean over agents of ‖trained − x̄‖₂ (x̄ the blend
each agent trained from), in the records, the metrics CSV and the summary JSON."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from peerd.learn.data import load_dataset
from peerd.learn.models import build_model, default_model_kind
from peerd.sim.output import summary_json, write_outputs
from peerd.sim.runner import SimConfig, run

# One agent holding all the data, one step with a batch bigger than the data: the step is
# plain gradient descent on the full training set, with no sampling left to chance.
ONE = SimConfig(dataset="digits", partition="iid", agents=1, rounds=1, local_steps=1,
                batch_size=100_000, lr=0.1, algorithms=("isolated",), seed=4)


def _one_step_drift(cfg: SimConfig) -> float:
    data = load_dataset(cfg.dataset)
    model = build_model(default_model_kind(cfg.dataset), data.input_shape, data.num_classes,
                        seed=cfg.seed)
    loss = torch.nn.functional.cross_entropy(model(data.x_train), data.y_train)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    total = sum(float((cfg.lr * g.double()).pow(2).sum()) for g in grads)
    return math.sqrt(total)


def test_one_full_batch_step_drifts_lr_times_the_gradient_norm() -> None:
    (rec,) = run(ONE).records
    expect = _one_step_drift(ONE)
    assert expect > 0
    assert rec.drift_mean == pytest.approx(expect, rel=1e-4)
    # Twice the learning rate, twice the step: drift is the step's length.
    (rec2,) = run(replace(ONE, lr=0.2)).records
    assert rec2.drift_mean == pytest.approx(2 * expect, rel=1e-4)


SMALL = SimConfig(dataset="digits", partition="shards", agents=4, rounds=3, local_steps=2,
                  batch_size=32, algorithms=("cached-dfl", "fedavg"), capacity=2, tau_max=2,
                  blocks=3, block_length=100.0, round_seconds=30, seed=3)


def test_summary_csv_and_json_carry_the_drift(tmp_path: Path) -> None:
    result = run(SMALL)
    write_outputs(result, tmp_path, plots=False)
    with (tmp_path / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 * 2
    assert all(float(r["drift_mean"]) > 0 for r in rows)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == summary_json(result)
    for alg in ("cached-dfl", "fedavg"):
        res = summary["results"][alg]
        curve = [d for r, d in res["drift_curve"]]
        assert [r for r, _ in res["drift_curve"]] == [1, 2, 3]
        assert curve == [float(r["drift_mean"]) for r in rows if r["algorithm"] == alg]
        assert res["drift_mean"] == pytest.approx(sum(curve) / 3)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert all(r["drift_mean"] > 0 for r in metrics["rounds"])


def test_fedbss_with_plains_step_budget_differs_from_full_epochs() -> None:
    # Warm-up round 1 is plain training in both; the curriculum rounds then take K steps
    # with the budget and full epochs without it, so their drifts differ.
    fed = replace(SMALL, local_policy="fedbss", fedbss_warmup_rounds=1, fedbss_epochs=2)
    matched = run(replace(fed, fedbss_steps=SMALL.local_steps)).records
    full = run(fed).records
    assert [r.drift_mean for r in matched if r.round == 1] == \
        [r.drift_mean for r in full if r.round == 1]
    assert [r.drift_mean for r in matched if r.round == 3] != \
        [r.drift_mean for r in full if r.round == 3]
    with pytest.raises(ValueError, match="fedbss-steps"):
        replace(fed, fedbss_steps=-1).validate()
