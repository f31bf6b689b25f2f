"""A small fleet of real ``Daemon`` objects (no sockets) in any registered learning mode, for
the mode contract suite (tests/daemon/test_mode_contract.py).

Each mode gets the settings and task it needs (FedCache over digits, Pairwise-10 over MNIST,
sensors on 10 s time buckets) at a size that keeps a round well under a second; every member
is admitted and bound to its agent index, as a cordial fleet must be.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.core.modes import ModeName
from peerd.daemon.config import Config
from tests.daemon.helpers import fleet_config
from tests.daemon.test_daemon_membership import _keygen

runner = CliRunner()

#: What each mode runs on here: ``[learning]`` and ``[task]`` values over the defaults.
#: (``[learning]`` keys, its ``[learning.cordial]`` keys, ``[task]`` keys)
SETTINGS: dict[ModeName, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    ModeName.WEIGHTS: ({"local_steps": 3}, {}, {"name": "digits"}),
    ModeName.KNOWLEDGE: ({"local_steps": 3, "batch_size": 16}, {}, {"name": "digits"}),
    ModeName.CORDIAL: ({"local_steps": 2, "batch_size": 20}, {"images_per_digit": 5},
                       {"name": "mnist", "seed": 0}),
    ModeName.SENSORS: ({"local_steps": 3, "batch_size": 5},
                       {"bucket_s": 10.0, "window": 16}, {"name": "sensors", "seed": 4}),
}


class Clock:
    """A wall clock the test moves on (time mode ages entries by it)."""

    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def mode_configs(root: Path, mode: ModeName, n: int = 2) -> list[Config]:
    """``n`` members of one new fleet under ``root``, each bound to agent i, in ``mode``."""
    fleet = root / "fleet"
    assert runner.invoke(app, ["fleet", "init", str(fleet)]).exit_code == 0
    states = [root / f"st{i}" for i in range(n)]
    for i, node_id in enumerate([_keygen(s) for s in states]):
        out = runner.invoke(app, ["fleet", "admit", "--fleet", str(fleet), node_id,
                                  "--agent", str(i)])
        assert out.exit_code == 0, out.output
    cfgs = []
    for i, state in enumerate(states):
        (root / f"c{i}").mkdir()
        base = fleet_config(root / f"c{i}", fleet, state, with_manifest=True)
        cfgs.append(with_mode(dataclasses.replace(
            base, task=dataclasses.replace(base.task, node_index=i, node_count=n)), mode))
    return cfgs


def with_mode(cfg: Config, mode: ModeName) -> Config:
    """``cfg`` (same node, fleet and state directory) switched to ``mode``'s settings."""
    learning, cordial, task = SETTINGS[mode]
    return dataclasses.replace(
        cfg, learning=dataclasses.replace(
            cfg.learning, mode=mode, **learning,
            cordial=dataclasses.replace(cfg.learning.cordial, **cordial)),
        task=dataclasses.replace(cfg.task, **task))


Now = Callable[[], float]
