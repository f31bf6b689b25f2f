"""Weight mode with a python learner (issue 26, items 4 and 6): real ``Daemon`` objects in one
process, the learner in its worker. Rounds train through the worker and publish entries
with the learner's example count; a round whose learner raises or whose worker is SIGKILLed
publishes nothing and leaves the cache alone, counts the failure by reason, and the daemon
goes on answering status; after the crash backoff the next round publishes again.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import torch
import trio

from peerd.core.modes import ModeName
from peerd.daemon.config import Config, LearnerConfig
from peerd.daemon.daemon import Daemon
from peerd.daemon.modes.weights import WeightsMode
from peerd.daemon.startup import DaemonError
from peerd.learn.learner.worker import BACKOFF_BASE_S, WorkerLearner
from tests.daemon.modefleet import Clock, mode_configs
from tests.daemon.test_mode_contract import _gossip
from tests.learn import learners


def with_learner(cfg: Config, i: int, **over: object) -> Config:
    lc = LearnerConfig(kind="python", entry="tests.learn.learners:Scripted",
                       model="tests.learn.learners:model", device="cpu", timeout_s=20.0,
                       node_config={"partition-id": i})
    return dataclasses.replace(cfg, learner=dataclasses.replace(lc, **over))  # type: ignore[arg-type]


def weights(d: Daemon) -> WeightsMode:
    assert isinstance(d.mode, WeightsMode)
    return d.mode


def worker(d: Daemon) -> WorkerLearner:
    w = weights(d).worker
    assert w is not None
    return w


def test_a_python_learner_trains_publishes_fails_and_recovers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    do = tmp_path / "do"  # what the learners do next (tests.learn.learners.Scripted)
    monkeypatch.setenv("PEERD_TEST_DO", str(do))
    clock = Clock()
    a, b = (Daemon(with_learner(c, i), clock=clock)
            for i, c in enumerate(mode_configs(tmp_path, ModeName.WEIGHTS)))
    try:
        # Built seeded on every node: the same starting point.
        assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(),
                                                     b.model.state_dict().values(),
                                                     strict=True))
        assert worker(a).pid is not None  # started with the daemon
        before = {k: v.clone() for k, v in a.model.state_dict().items()}
        for d in (a, b):
            trio.run(d._round)
        _gossip([a, b], clock)
        for d, peer in ((a, b), (b, a)):
            own = d.node.own
            assert own is not None
            assert own.entry.meta.num_examples == learners.ROWS  # the learner's count
            assert d.metrics.examples == learners.ROWS
            assert d.metrics.val_accuracy is not None
            cached = {i.meta.origin: i.meta for i in d.node.cache}
            assert cached[peer.node.id].num_examples == learners.ROWS
        moved = sum(float((a.model.state_dict()[k] - before[k]).abs().sum()) for k in before)
        assert moved > 0.0
        assert weights(a).learner_stats.metrics.keys() == {"train_loss", "lr"}

        # A learner that raises: nothing published, the cache as it was, counted, logged.
        do.write_text("raise")
        version, cache = a.metrics.version, [(i.meta.origin, i.meta.version)
                                             for i in a.node.cache]
        trio.run(a._round)
        stats = weights(a).learner_stats
        assert a.metrics.version == version
        assert a.node.own is not None
        assert a.node.own.entry.meta.version == version
        assert [(i.meta.origin, i.meta.version) for i in a.node.cache] == cache
        assert stats.failed["raised"] == 1
        assert (stats.last_failure, stats.last_detail) == ("raised", "ValueError: bad batch")
        status = a.status()  # still answering, and saying why
        assert status.node.round == a.node.round
        assert status.config.learner == "python"
        assert status.learner is not None
        assert (status.learner.failed["raised"], status.learner.last_failure) == (1, "raised")
        assert status.learner.worker_pid == worker(a).pid
        assert status.learner.metrics.keys() == {"train_loss", "lr"}  # the last good fit's

        # The worker SIGKILLed mid-fit: crashed, and while it backs off rounds fail at once.
        do.write_text("kill")
        trio.run(a._round)
        assert stats.failed["crashed"] == 1
        assert "SIGKILL" in (stats.last_detail or "")
        do.write_text("train")
        began = time.monotonic()
        trio.run(a._round)
        assert stats.failed["crashed"] == 2
        assert "restarting in" in (stats.last_detail or "")
        assert a.metrics.version == version
        time.sleep(max(0.0, BACKOFF_BASE_S - (time.monotonic() - began)) + 0.1)
        trio.run(a._round)
        assert a.metrics.version == version + 1  # recovered: published again
        assert worker(a).restarts == 1
        records = a.participation.answer(None)["records"]
        assert [r["published"] is not None for r in records] == [True, False, False, False,
                                                                 True]
        # The round log keeps each round's learner metrics (fit and evaluate) or its refusal.
        learned = [r["learner"] for r in records]
        assert learned[0]["fit_metrics"].keys() == {"train_loss", "lr"}
        assert learned[0]["eval_metrics"].keys() == {"accuracy"}
        assert (learned[0]["failure"], learned[0]["detail"]) == (None, None)
        assert learned[1] == {"fit_metrics": {}, "eval_metrics": {}, "failure": "raised",
                              "detail": "ValueError: bad batch"}
        assert [x["failure"] for x in learned] == [None, "raised", "crashed", "crashed", None]
        assert learned[4]["fit_metrics"]["train_loss"] == stats.metrics["train_loss"]
        assert a.state.audit_path.read_text().count('"learner_failed"') == 3
    finally:
        for d in (a, b):
            d.close()
    assert not list((a.cfg.node.state_dir / "learner").iterdir())  # buffers removed


def test_an_entry_that_cannot_start_stops_the_daemon_at_start_up(tmp_path: Path) -> None:
    (cfg,) = mode_configs(tmp_path, ModeName.WEIGHTS, n=1)
    with pytest.raises(DaemonError, match=r"\[learner\] entry tests\.learn\.nope:x: the python "
                                          r"learner's worker could not build the learner"):
        Daemon(with_learner(cfg, 0, entry="tests.learn.nope:x"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has the device")
def test_a_builtin_learner_on_a_missing_device_stops_the_daemon_at_start_up(
        tmp_path: Path) -> None:
    (cfg,) = mode_configs(tmp_path, ModeName.WEIGHTS, n=1)
    builtin = dataclasses.replace(cfg, learner=LearnerConfig(kind="builtin", device="cuda:0"))
    with pytest.raises(DaemonError) as err:
        Daemon(builtin)
    # peerd run prints it as its one start-up line and exits 2 (cli/run.py).
    assert str(err.value) == ('[learner] device: "cuda:0" asked for, but torch sees no CUDA '
                              "device on this machine")
