"""The daemon's cordial round on time buckets: the window keeps the last W buckets, views map to
its buckets across the ring's wrap, published ids are sorted, the held-out buckets are scored
before they are trained on, and agents exchanging views reach a lower loss than isolated ones
(the paper's direction); the learner's state survives a restart."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from peerd.core import cordial as cl
from peerd.core.timebuckets import VIEW_IDS
from peerd.learn import learnerstate
from peerd.learn.cordialround import PeerView
from peerd.learn.sensorround import SensorLearner, SensorRoundOutput
from peerd.learn.sensors import SensorFleet
from peerd.store import learnerfile
from peerd.store.statedir import StateDir

WRAP = 5 * VIEW_IDS  # a bucket number where the ring of ids wraps


def _view(agent: int, out: SensorRoundOutput) -> PeerView:
    return PeerView(agent, out.ids.astype(np.int64), out.views)


def test_the_window_keeps_the_last_buckets_and_fills_the_missed_ones() -> None:
    learner = SensorLearner(SensorFleet(2, seed=1), 0, window=5)
    learner.observe(100)
    assert learner.buckets == [96, 97, 98, 99, 100]  # a fresh node fills its window
    learner.observe(100)
    assert learner.buckets == [96, 97, 98, 99, 100]  # same bucket: nothing new
    learner.observe(102)
    assert learner.buckets == [98, 99, 100, 101, 102]
    learner.observe(200)
    assert learner.buckets == [196, 197, 198, 199, 200]
    x, y = SensorFleet(2, seed=1).observe(0, learner.buckets)
    assert torch.equal(learner.x, x)
    assert torch.equal(learner.y, y)


def test_views_map_to_the_window_across_the_wrap() -> None:
    fleet = SensorFleet(4, seed=2)
    learner = SensorLearner(fleet, 1, window=4)
    learner.observe(WRAP + 1)  # buckets WRAP-2 .. WRAP+1: ids V-2, V-1, 0, 1
    v = np.arange(1, 5, dtype=np.float32)[:, None]
    table, present, coverage = learner.received([
        PeerView(0, np.array([0, 1, VIEW_IDS - 2, VIEW_IDS - 1]), v),
        PeerView(2, np.array([1, 500]), v[:2]),  # 500 is no bucket of the window
        PeerView(0, np.array([0]), v[:1] * 9),  # a staler view of agent 0: ignored
        PeerView(1, np.array([0]), v[:1]),  # claims to be us: ignored
        PeerView(7, np.array([0]), v[:1]),  # no such agent
    ])
    assert coverage == {0: 4, 2: 1}
    assert table[:, 0, 0].tolist() == [3.0, 4.0, 1.0, 2.0]  # in bucket order
    assert table[:, 2, 0].tolist() == [0.0, 0.0, 0.0, 1.0]  # absent: zero input
    assert float(table[:, 1].abs().sum()) == 0.0
    assert float(table[:, 3].abs().sum()) == 0.0
    assert present.tolist() == [True, True, True, True]


def test_a_round_publishes_h_for_the_window_with_sorted_ids() -> None:
    learner = SensorLearner(SensorFleet(3, seed=4), 2, window=6, steps=3)
    out = learner.round(WRAP + 2, [])
    assert out.ids.tolist() == [0, 1, 2, VIEW_IDS - 3, VIEW_IDS - 2, VIEW_IDS - 1]
    h = (learner.x @ learner.m.T).numpy().astype(np.float32)
    np.testing.assert_array_equal(out.views, np.concatenate([h[3:], h[:3]]))
    # No peer's view yet: nothing to train on or score with coordination.
    assert (out.held_out, out.iterations, out.coverage) == (0, 0, {})
    assert math.isnan(out.train_loss)
    assert math.isnan(out.val_loss)
    isolated = SensorLearner(SensorFleet(3, seed=4), 2, window=6, steps=3, coordination=False)
    alone = isolated.round(WRAP + 2, [])  # the baseline trains on every bucket
    assert (alone.held_out, alone.iterations) == (6, 3)
    assert alone.train_loss > 0.0
    again = isolated.round(WRAP + 3, [])
    assert again.held_out == 1  # only the new bucket was not trained on yet


def _fleet_run(coordination: bool, rounds: int, seed: int) -> tuple[list[SensorLearner],
                                                                     list[float]]:
    fleet = SensorFleet(3, seed=seed)
    agents = [SensorLearner(fleet, i, window=32, coordination=coordination, steps=10)
              for i in range(3)]
    outs: list[SensorRoundOutput] = []  # the last round's: every agent's view
    held_out = []
    for r in range(rounds):
        outs = [a.round(1_000 + r, [_view(j, o) for j, o in enumerate(outs) if j != i])
                for i, a in enumerate(agents)]
        held_out.append(float(np.mean([o.val_loss for o in outs])))
    return agents, held_out


@pytest.mark.parametrize("seed", [1, 3])
def test_agents_with_views_learn_below_isolated_ones(seed: int) -> None:
    cordial, cordial_held = _fleet_run(True, 40, seed)
    isolated, isolated_held = _fleet_run(False, 40, seed)
    prob = cordial[0].fleet.problem

    def stacked(agents: list[SensorLearner]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.stack([a.m for a in agents])[None], torch.stack([a.lam for a in agents])[None]

    m, lam = stacked(cordial)
    m_iso, _ = stacked(isolated)
    # The paper's losses in closed form: the cordial fleet (14) against the isolated one (4).
    cordial_loss = float(cl.cordial_loss(m, lam, prob.a, prob.b, prob.cov).mean())
    isolated_loss = float(cl.isolated_loss(m_iso, prob.a, prob.b, prob.cov).mean())
    assert cordial_loss < 0.5 * isolated_loss
    # And what the round reports: the held-out buckets' error, last 10 rounds.
    assert np.mean(cordial_held[-10:]) < 0.5 * np.mean(isolated_held[-10:])


# --- the learner file ------------------------------------------------------------------------


def _trained(rounds: int = 3, **kw: object) -> tuple[SensorLearner, list[PeerView]]:
    fleet = SensorFleet(2, seed=6)
    peer = SensorLearner(fleet, 1, window=8)
    learner = SensorLearner(fleet, 0, window=8, steps=4, **kw)  # type: ignore[arg-type]
    views: list[PeerView] = []
    for r in range(rounds):
        views = [_view(1, peer.round(500 + r, []))]
        learner.round(500 + r, views)
    return learner, views


def test_a_restored_sensor_agent_continues_exactly(tmp_path: Path) -> None:
    a, views = _trained()
    state = StateDir(tmp_path / "st")
    assert learnerstate.save(state, a, 3)
    b = SensorLearner(a.fleet, 0, window=8, steps=4)
    assert learnerstate.restore(state, b) == 3
    assert torch.equal(a.m, b.m)
    assert torch.equal(a.lam, b.lam)
    assert (b.buckets, b.iterations, b.seen) == (a.buckets, a.iterations, a.seen)
    assert torch.equal(a.x, b.x)
    for r in (503, 505):  # and continues as if it had not stopped (a missed bucket too)
        out_a, out_b = a.round(r, views), b.round(r, views)
        np.testing.assert_array_equal(out_a.views, out_b.views)
        assert (out_a.train_loss, out_a.val_loss) == (out_b.train_loss, out_b.val_loss)
    fresh = SensorLearner(a.fleet, 0, window=8, steps=4)
    assert not np.array_equal(fresh.round(505, views).views, out_a.views)


def test_another_sensor_fleet_or_window_starts_fresh_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a, _ = _trained()
    state = StateDir(tmp_path / "st")
    assert learnerstate.save(state, a, 3)
    for other, reason in [
        (SensorLearner(a.fleet, 0, window=9), "window 8 (now 9)"),
        (SensorLearner(SensorFleet(2, seed=7), 0, window=8), "seed 6 (now 7)"),
        (SensorLearner(a.fleet, 0, window=8, bucket_s=5.0), "bucket_s '10.0' (now '5.0')"),
        (SensorLearner(a.fleet, 0, window=8, coordination=False), "coordination 1 (now 0)"),
    ]:
        m0 = other.m.clone()
        caplog.clear()
        with caplog.at_level("WARNING"):
            assert learnerstate.restore(state, other) is None
        assert reason in caplog.text
        assert torch.equal(other.m, m0)
        assert (other.buckets, other.iterations) == ([], 0)


def test_a_sensor_state_with_values_it_cannot_have_leaves_it_fresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a, _ = _trained()
    good = a.snapshot(3)
    state = StateDir(tmp_path / "st")
    unsorted = dict(good.tensors, buckets=good.tensors["buckets"][::-1].copy())
    nan_m = dict(good.tensors, m=np.full_like(good.tensors["m"], np.nan))
    for tensors, counts, reason in [
        (unsorted, good.counts, "not a window"),
        (nan_m, good.counts, "NaN or Inf in m"),
        (good.tensors, {**good.counts, "buckets": 9}, "do not fit this learner"),
    ]:
        assert learnerfile.save(state, learnerfile.LearnerState(
            good.mode, good.identity, 3, counts, tensors))
        b = SensorLearner(a.fleet, 0, window=8, steps=4)
        caplog.clear()
        with caplog.at_level("WARNING"):
            assert learnerstate.restore(state, b) is None
        assert reason in caplog.text
        assert (b.buckets, b.iterations, b.seen) == ([], 0, -1)
