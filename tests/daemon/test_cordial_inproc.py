"""Cordial mode between two daemons: views carry what one digit alone cannot tell.

Two real ``Daemon`` objects in one process (tests/daemon/inprocfleet.py) are the two agents
of Pairwise-10 composite MNIST (P = 25: agent 0 sees digit a, agent 1 digit 10 − a of the
same composites, ids aligned by the shared index's seed). Every node must hold the other's
view for all 675 ids and use it, and end ``ROUNDS`` rounds with a test accuracy at least
``GAP`` above the same agent trained without views. "Without views" is computed here by the
very code the daemon runs (:class:`peerd.learn.cordialround.CordialLearner`) with the same
data, seed and settings but no peer: until the first view arrives the daemon's round *is*
that run, bit for bit (checked), so the two differ by the views alone. What the network
adds (mDNS, libp2p) is tests/integration/test_cordial.py's smoke; the 40 rounds of real
daemons there are ``long``.
"""

from __future__ import annotations

import functools
import logging
import re
import statistics
from pathlib import Path

import pytest
import torch
import trio

from peerd.core.modes import ModeName
from peerd.learn import pairwise10
from peerd.learn.cordialround import CordialLearner, agent_data, index_size
from tests.daemon.inprocfleet import Fleet, fleet_configs

ROUNDS = 40
GAP = 0.05
WARMUP = 5
LEARNING = {"round_interval_s": 1.0, "capacity": 1, "batch_size": 65, "local_steps": 4,
            "tau_max": 120.0}
CORDIAL = {"warmup_epochs": WARMUP, "images_per_digit": 25}
TASK = {"name": "mnist", "node_count": 2, "seed": 0}
ROUND_LINE = re.compile(r"round (\d+): version \d+, epoch [\d.]+, loss [\d.na]+, val acc "
                        r"[\d.]+, test acc ([\d.]+), views of (\d+)/1 peer agents")


@pytest.fixture(autouse=True)
def mnist_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The four draws (two daemons, two baselines) take their composites from one read of
    MNIST: ``load_images`` decodes, converts (float64) and normalises all 70,000 images on
    each call (this file's CPU: 43 s user+sys with four reads, 32 s with one), and
    ``make_draw`` copies the images it takes, so sharing them changes no value computed."""
    # Where agent_data looks it up (cordialround imported the name).
    monkeypatch.setattr("peerd.learn.cordialround.load_images",
                        functools.cache(pairwise10.load_images))


def alone(index: int, rounds: int) -> list[float]:
    """The daemon's cordial round without any view, for ``rounds`` rounds."""
    torch.set_num_threads(1)  # as the daemon trains ([node] torch_threads = 1)
    learner = CordialLearner(agent_data(2, index, 25, 0), warmup_epochs=WARMUP,
                             batch_size=65, steps=4, seed=0)
    return [learner.round([]).test_accuracy for _ in range(rounds)]


def test_two_agents_exchange_views_and_beat_learning_without_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = Fleet(fleet_configs(tmp_path, 2, mode=ModeName.CORDIAL, learning=LEARNING,
                                cordial=CORDIAL, task=TASK))
    caplog.set_level(logging.INFO, logger="peerd.daemon.modes.base")
    #: Round -> (test accuracy, peer views used), from each daemon's round log line.
    curves: list[dict[int, tuple[float, int]]] = [{}, {}]
    for _ in range(ROUNDS):
        for i, d in enumerate(fleet.daemons):
            caplog.clear()
            trio.run(d._round)
            (line,) = [m for m in (r.getMessage() for r in caplog.records)
                       if m.startswith("round ")]
            m = ROUND_LINE.fullmatch(line)
            assert m is not None, line
            curves[i][int(m[1])] = (float(m[2]), int(m[3]))
        fleet.clock.t += LEARNING["round_interval_s"]
        fleet.sweep()
    ids = index_size(25)
    report = []
    for i, d in enumerate(fleet.daemons):
        s = d.status()
        other = fleet[1 - i]
        views = s.views
        assert views is not None
        assert (views.agent, views.agents, views.ids) == (i, 2, ids)
        assert views.coordination is True
        (row,) = views.peers
        assert (row.origin, row.agent, row.ids, row.used) == (other.node.id, 1 - i, ids, True)
        assert s.cache[0].kind == "knowledge"  # a view is a knowledge entry ...
        assert s.cache[0].group == f"agent-{1 - i}"  # ... naming its agent
        assert s.rejected == {}
        together = curves[i]
        assert set(together) == set(range(1, ROUNDS + 1))
        baseline = alone(i, ROUNDS)
        for r in range(1, ROUNDS + 1):  # no view yet: the very computation of the baseline
            if together[r][1] > 0:
                break
            assert abs(together[r][0] - baseline[r - 1]) <= 5e-4, (together, baseline)
        assert together[ROUNDS][1] == 1
        report.append((together[ROUNDS][0], baseline[-1]))
    print(f"test accuracy at round {ROUNDS} (with views, without):", report)  # with -s
    with_views = statistics.mean(r[0] for r in report)
    without = statistics.mean(r[1] for r in report)
    assert with_views >= without + GAP, report
