"""A saved learner that had diverged is not brought back (issue 24 item 2): a learner file
holding NaN/Inf, or parameters far beyond any healthy agent's, is refused on restore with one
line saying why, set aside in quarantine/, and the learner starts fresh; the next save is
restored as usual."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from peerd.core.timebuckets import bucket_of
from peerd.learn import learnerstate
from peerd.learn.cordialround import WIDTH, CordialLearner, PeerView, agent_data
from peerd.learn.linearproblem import M_OUT
from peerd.learn.pairwise10 import load_images
from peerd.learn.sensorround import SensorLearner
from peerd.learn.sensors import SensorFleet
from peerd.store import learnerfile
from peerd.store.learnerfile import LEARNER_BLOB, LearnerState
from peerd.store.statedir import StateDir


def _sensor() -> SensorLearner:
    return SensorLearner(SensorFleet(3, seed=4), 0, window=8, batch_size=3, steps=4)


def _sensor_views(learner: SensorLearner) -> list[PeerView]:
    rng = np.random.default_rng(0)
    ids = np.array([b % 65536 for b in learner.buckets], dtype=np.int64)
    return [PeerView(j, ids, rng.standard_normal((len(ids), M_OUT)).astype(np.float32))
            for j in (1, 2)]


def _trained_sensor() -> SensorLearner:
    learner = _sensor()
    now = bucket_of(1_800_000_000.0, 10.0)
    for k in range(4):
        learner.observe(now + k)
        learner.round(now + k, _sensor_views(learner))
    return learner


def _with(state: LearnerState, name: str, value: float) -> LearnerState:
    tensors = dict(state.tensors)
    a = np.array(tensors[name], copy=True)
    a.flat[0] = value
    tensors[name] = a
    return LearnerState(state.mode, state.identity, state.round, state.counts, tensors,
                        state.bfloat16)


def _refused(tmp_path: Path, state: LearnerState, fresh: SensorLearner | CordialLearner,
             caplog: pytest.LogCaptureFixture) -> str:
    """Save ``state``, restore it into ``fresh``: refused, quarantined, one warning line."""
    d = StateDir(tmp_path / "st")
    assert learnerfile.save(d, state)
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert learnerstate.restore(d, fresh) is None
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert not d.blob_path(LEARNER_BLOB).exists()
    assert len(list(d.quarantine.iterdir())) == 1
    return warnings[0].getMessage()


@pytest.mark.parametrize(("name", "value", "why"), [
    ("lam", math.nan, "NaN or Inf in lam"),
    ("m", math.inf, "NaN or Inf in m"),
    ("lam", 4.9e63, "Λ_j^i reaches |4.9e+63|"),  # the diverged agent
    ("m", -2e4, "M_i reaches |2e+04|"),
])
def test_a_diverged_sensor_learner_is_refused_and_a_healthy_one_restores(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, value: float, why: str
) -> None:
    good = _trained_sensor()
    fresh = _sensor()
    before = (fresh.m.clone(), fresh.lam.clone(), fresh.iterations)
    message = _refused(tmp_path, _with(good.snapshot(4), name, value), fresh, caplog)
    assert why in message
    assert "round 4 starts fresh" in message
    assert torch.equal(fresh.m, before[0])
    assert torch.equal(fresh.lam, before[1])
    assert fresh.iterations == before[2] == 0
    # the restart after a healthy round's save restores it, exactly
    d = StateDir(tmp_path / "st")
    assert learnerstate.save(d, good, 5)
    again = _sensor()
    assert learnerstate.restore(d, again) == 5
    assert torch.equal(again.m, good.m)
    assert torch.equal(again.lam, good.lam)
    assert again.iterations == good.iterations > 0


@pytest.mark.parametrize(("value", "why"), [(math.nan, "NaN or Inf in model.lam"),
                                            (1e9, "lam reaches |1e+09|")])
def test_a_diverged_cordial_agent_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                             value: float, why: str) -> None:
    data = agent_data(4, 1, 3, seed=5, images=load_images())
    a = CordialLearner(data, warmup_epochs=1, batch_size=8, steps=3, seed=5)
    rng = np.random.default_rng(0)
    a.round([PeerView(j, np.arange(data.size), rng.random((data.size, WIDTH), dtype=np.float32))
             for j in (0, 2, 3)])
    fresh = CordialLearner(data, warmup_epochs=1, batch_size=8, steps=3, seed=5)
    before = copy.deepcopy(fresh.model.state_dict())
    assert why in _refused(tmp_path, _with(a.snapshot(1), "model.lam", value), fresh, caplog)
    for k, v in before.items():
        assert torch.equal(fresh.model.state_dict()[k], v), k
    assert fresh.done_steps == 0
