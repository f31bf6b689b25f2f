"""A restarted daemon keeps what its local learner learned: a real knowledge-mode ``Daemon``
object runs rounds (no sockets), a second one on the same state directory is the restart.
(Cordial mode's learner is tested in tests/learn/test_learnerstate.py: a cordial daemon loads
MNIST at every start, ~7 s each here.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
import trio

from peerd.daemon.config import Config
from peerd.daemon.daemon import Daemon
from peerd.daemon.modes.base import run_round
from peerd.learn.knowround import task_model
from peerd.store.learnerfile import LEARNER_BLOB
from tests.daemon.test_daemon_membership import _daemon


def _config(tmp_path: Path, *, task: dict[str, Any] | None = None,
            learning: dict[str, Any] | None = None) -> Config:
    cfg = _daemon(tmp_path, admitted=True).cfg
    base = {"mode": "knowledge", "local_steps": 3, "batch_size": 16, **(learning or {})}
    return dataclasses.replace(cfg, learning=dataclasses.replace(cfg.learning, **base),
                               task=dataclasses.replace(cfg.task, **(task or {})))


def _params(d: Daemon) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in d.model.state_dict().items()}


def _run_round(d: Daemon) -> None:
    assert d.mode.learner is not None  # a mode with a learner file (knowledge, cordial)
    trio.run(run_round, d, d.mode)


def _audit_events(d: Daemon) -> list[dict[str, Any]]:
    return [r for r in d.state.read_audit() if r["event"] == "learner_restored"]


def test_a_knowledge_node_restarts_with_its_model_and_continues(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _config(tmp_path)
    first = Daemon(cfg)
    fresh = _params(first)
    _run_round(first)
    _run_round(first)
    trained = _params(first)
    assert any(not torch.equal(fresh[k], trained[k]) for k in fresh)
    with caplog.at_level("INFO"):
        second = Daemon(cfg)  # the restart
    assert "restored the local learner (knowledge mode) at round 2" in caplog.text
    assert second.node.round == 2
    for k, v in trained.items():
        assert torch.equal(second.model.state_dict()[k], v), k
    assert [(r["mode"], r["round"]) for r in _audit_events(second)] == [("knowledge", 2)]
    # It continues where the first left off: round 3's seed and its model are the same as if
    # it had never stopped (the knowledge round is deterministic given them).
    _run_round(first)
    _run_round(second)
    for k, v in _params(first).items():
        assert torch.equal(second.model.state_dict()[k], v), k


def test_a_config_that_builds_another_model_starts_fresh_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _config(tmp_path, task={"model": "small"})
    first = Daemon(cfg)
    _run_round(first)
    other = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, model="medium"))
    with caplog.at_level("INFO"):
        second = Daemon(other)
    assert "not restoring the local learner saved after round 1" in caplog.text
    assert "model 'small' (now 'medium')" in caplog.text
    assert "restored the local learner" not in caplog.text
    assert second.node.round == 1  # the node's counters are kept; only the learner is fresh
    fresh = task_model(second.task, "medium")  # what the config builds, from its seed
    for k, v in fresh.state_dict().items():
        assert torch.equal(second.model.state_dict()[k], v), k
    _run_round(second)  # the next save replaces the old learner with this config's
    caplog.clear()
    with caplog.at_level("INFO"):
        Daemon(other)
    assert "restored the local learner (knowledge mode) at round 2" in caplog.text


def test_a_corrupt_learner_file_is_quarantined_and_the_node_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _config(tmp_path)
    first = Daemon(cfg)
    _run_round(first)
    path = first.state.blob_path(LEARNER_BLOB)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # a flipped bit in the payload
    path.write_bytes(bytes(data))
    with caplog.at_level("WARNING"):
        second = Daemon(cfg)
    assert "corrupt state file" in caplog.text
    assert "SHA-256 mismatch" in caplog.text
    assert not path.exists()
    assert [p.name.split(".")[0] for p in first.state.quarantine.iterdir()] == [LEARNER_BLOB]
    assert _audit_events(second) == []
    _run_round(second)  # and it learns and saves again
    assert path.exists()
