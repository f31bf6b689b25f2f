"""The sensor task (cordial mode on time buckets): every node of one seed draws the same
fleet-wide sample for a bucket and keeps its own component; components are correlated and each
agent's label depends on the others' inputs, as in §6.1; the plain-task face of the data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from peerd.learn.sensors import SensorFleet
from peerd.learn.tasks import SENSOR_ROWS, SensorTask, load_task


def test_two_nodes_of_one_seed_see_components_of_the_same_draw() -> None:
    node_a, node_b = SensorFleet(4, seed=3), SensorFleet(4, seed=3)  # computed apart
    x, y = node_a.draw(1_234_567)
    xa, ya = node_a.observe(0, [1_234_567, 1_234_568])
    xb, yb = node_b.observe(2, [1_234_567, 1_234_568])
    assert torch.equal(xa[0], x[0])
    assert torch.equal(xb[0], x[2])
    assert torch.equal(ya[0], y[0])
    assert torch.equal(yb[0], y[2])
    assert not torch.equal(xa[0], xa[1])  # another bucket, another draw
    other, _ = SensorFleet(4, seed=4).draw(1_234_567)
    assert not torch.equal(other, x)  # another fleet seed, another draw
    again, _ = SensorFleet(4, seed=3).draw(1_234_567)
    assert torch.equal(again, x)


def test_components_are_correlated_and_labels_read_the_others_inputs() -> None:
    fleet = SensorFleet(3, seed=11)
    prob = fleet.problem
    buckets = range(3000)
    xs = torch.stack([fleet.draw(b)[0] for b in buckets])  # [T, N, d]
    corr = np.corrcoef(xs[:, :, 0].T.numpy())
    cov = prob.cov[0].numpy()  # Cov(X_j, X_i) = cov[j, i]·I, unit variances
    assert np.abs(corr - cov).max() < 0.06  # 3,000 draws: standard error ~0.02
    assert np.abs(cov - np.eye(3)).max() > 0.1  # and they are correlated
    x, y = fleet.draw(77)
    own = prob.a[0, 0] @ x[0]
    others = sum(prob.b[0, 0, j] @ x[j] for j in (1, 2))
    torch.testing.assert_close(y[0], own + others)  # Y_i = A_i X_i + Σ_j B_j^i X_j
    assert float(torch.as_tensor(others).abs().sum()) > 0.0


def test_bad_fleets_and_buckets_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 2 agents"):
        SensorFleet(1, seed=0)
    fleet = SensorFleet(2, seed=0)
    with pytest.raises(ValueError, match="bucket -1"):
        fleet.draw(-1)
    with pytest.raises(ValueError, match="agent index 2"):
        fleet.observe(2, [0])


def test_the_plain_task_face() -> None:
    task = load_task("sensors", node_index=1, node_count=3, seed=5)
    assert isinstance(task, SensorTask)
    assert task.loss == "mse"
    data = task.data()
    assert len(data.X_train) + len(data.X_val) == SENSOR_ROWS
    assert data.X_train.shape[1] == 2
    assert data.y_train.shape[1] == 1
    x, _ = SensorFleet(3, seed=5).observe(1, [0])
    torch.testing.assert_close(data.X_train[0], x[0].float())
    model = task.model()
    assert tuple(model(data.X_val).shape) == (len(data.X_val), 1)
