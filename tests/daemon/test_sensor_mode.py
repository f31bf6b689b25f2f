"""Cordial mode on time buckets between real ``Daemon`` objects (no sockets): each round the
daemons take the current bucket, train, publish their window's h_i as a signed view, and a
gossip session in memory carries the views across; status shows whose views are held and how
many of the window's buckets they cover; a restart restores the agent."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import trio
from typer.testing import CliRunner

from peerd.core.modes import ModeName
from peerd.core.timebuckets import bucket_of
from peerd.daemon.config import Config, CordialConfig
from peerd.daemon.daemon import Daemon
from peerd.daemon.modes.sensors import SensorMode
from peerd.net.gossip import SessionContext
from peerd.node.knowstate import TypedHeld
from tests.daemon.modefleet import mode_configs
from tests.net.test_gossip import session

runner = CliRunner()
START = 1_800_000_000.0
BUCKET_S, WINDOW = 10.0, 12


class Clock:
    def __init__(self) -> None:
        self.t = START

    def __call__(self) -> float:
        return self.t


def _configs(tmp_path: Path, n: int, *, coordination: bool = True) -> list[Config]:
    """``n`` sensor agents of one fleet (tests.daemon.modefleet), with this module's buckets,
    window and steps."""
    return [dataclasses.replace(c, learning=dataclasses.replace(
        c.learning, local_steps=10, batch_size=5,
        cordial=CordialConfig(bucket_s=BUCKET_S, window=WINDOW, coordination=coordination)))
        for c in mode_configs(tmp_path, ModeName.SENSORS, n)]


def _mode(d: Daemon) -> SensorMode:
    assert isinstance(d.mode, SensorMode)
    return d.mode


def _round_and_gossip(daemons: list[Daemon], clock: Clock) -> None:
    for d in daemons:
        trio.run(d._round)
    ctx = SessionContext(admin_key=daemons[0].cfg.fleet.admin_public_key, now=clock)
    for a in range(len(daemons)):
        for b in range(a + 1, len(daemons)):
            session(daemons[a].node, daemons[b].node, a_ctx=ctx, b_ctx=ctx)
    clock.t += BUCKET_S


def test_sensor_daemons_exchange_views_of_the_same_buckets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    cfgs = _configs(tmp_path, 3)
    daemons = [Daemon(cfg, clock=clock) for cfg in cfgs]
    first = daemons[0].status().views
    assert first is not None
    assert (first.agent, first.agents, first.ids, first.peers) == (0, 3, 0, ())
    _round_and_gossip(daemons, clock)
    views = daemons[0].status().views
    assert views is not None
    assert views.ids == WINDOW
    assert sorted(row.agent for row in views.peers if row.agent is not None) == [1, 2]
    assert all(row.ids == WINDOW for row in views.peers)  # the same buckets, every node
    assert not any(row.used for row in views.peers)  # none has fed a round yet
    own = daemons[0].node.own
    assert isinstance(own, TypedHeld)
    ids = own.arrays["ids"]
    assert len(ids) == WINDOW
    assert bool(np.all(np.diff(ids) > 0))
    now_bucket = bucket_of(START, BUCKET_S)
    assert set(ids.tolist()) == {b % 65536 for b in range(now_bucket - WINDOW + 1,
                                                          now_bucket + 1)}
    for _ in range(8):
        _round_and_gossip(daemons, clock)
    views = daemons[0].status().views
    assert views is not None
    rows = [r for r in views.peers if r.agent is not None]
    assert all(r.used for r in rows)
    assert all(r.ids == WINDOW for r in rows)
    assert views.test_loss is not None
    assert math.isfinite(views.test_loss)
    assert views.epoch == _mode(daemons[0]).learner.iterations > 0
    assert math.isfinite(daemons[0].metrics.val_loss)
    trio.run(daemons[0]._round)  # a new bucket that the peers' views do not hold yet
    views = daemons[0].status().views
    assert views is not None
    assert views.ids == WINDOW
    assert [r.ids for r in views.peers if r.agent is not None] == [WINDOW - 1] * 2
    iterations = _mode(daemons[1]).learner.iterations
    with caplog.at_level("INFO"):
        again = Daemon(cfgs[1], clock=clock)  # the restart
    assert "restored the local learner (cordial mode) at round 9" in caplog.text
    assert _mode(again).learner.iterations == iterations
    assert _mode(again).learner.buckets == _mode(daemons[1]).learner.buckets
