"""examples/external_loop: the plain loop runs, unchanged, as the external learner of a real
``Daemon`` object: every round publishes a new signed version and the model learns."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

from peerd.core.modes import ModeName
from peerd.daemon.config import LearnerConfig
from peerd.daemon.daemon import Daemon
from tests.daemon.modefleet import Clock, mode_configs
from tests.daemon.test_learner_external import attached

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_example_loop_publishes_every_round_and_learns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))  # the daemon builds external_loop.model:Net
    (cfg,) = mode_configs(tmp_path, ModeName.WEIGHTS, n=1)
    cfg = dataclasses.replace(cfg, learner=LearnerConfig(
        kind="external", model="external_loop.model:Net", device="cpu"),
        learning=dataclasses.replace(cfg.learning, local_steps=40))
    d = Daemon(cfg, clock=Clock())
    loop = importlib.import_module("external_loop.loop")
    lines: list[str] = []
    receipts = attached(d, lambda: loop.run(str(cfg.node.state_dir), rounds=3,
                                            say=lines.append))
    assert [r.version for r in receipts] == [1, 2, 3]
    assert d.metrics.version == 3
    own = d.node.own
    assert own is not None
    assert own.entry.meta.num_examples == len(loop.digits_share(0, 1)[1])
    st = d.status().learner
    assert st is not None
    # Chance is 0.1; 120 AdamW steps of a small MLP get far past it.
    assert st.metrics["accuracy"] > 0.6
    assert lines[-1].startswith("round 3: blend of 1, val acc")  # alone: its own model only
