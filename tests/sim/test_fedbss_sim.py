"""``peerd sim --local-policy fedbss``: warm-up rounds are the plain run's rounds exactly, the
curriculum rounds then differ; bad names are refused; the CLI takes the flags."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.core.fedbss import FedBSS
from peerd.core.round import PLAIN
from peerd.sim.runner import SimConfig, run

SMALL = SimConfig(dataset="digits", partition="shards", agents=4, rounds=3, local_steps=2,
                  batch_size=32, algorithms=("cached-dfl", "fedavg"), capacity=2, tau_max=2,
                  blocks=3, block_length=100.0, round_seconds=30, seed=3)


def _numbers(cfg: SimConfig) -> list[tuple[int, str, float, float]]:
    return [(r.round, r.algorithm, r.accuracy_mean, r.train_loss) for r in run(cfg).records]


def test_warmup_rounds_are_the_plain_run_then_the_curriculum_differs() -> None:
    plain = _numbers(SMALL)
    fed = _numbers(replace(SMALL, local_policy="fedbss", fedbss_warmup_rounds=2,
                           fedbss_epochs=2))
    assert [r for r in fed if r[0] <= 2] == [r for r in plain if r[0] <= 2]
    assert [r for r in fed if r[0] == 3] != [r for r in plain if r[0] == 3]


def test_local_policy_names() -> None:
    assert SMALL.local() is PLAIN
    assert replace(SMALL, local_policy="fedbss", fedbss_epochs=4).local() == FedBSS(20, 4)
    with pytest.raises(ValueError, match="local policy"):
        replace(SMALL, local_policy="bss").validate()
    with pytest.raises(ValueError, match="epochs"):
        replace(SMALL, local_policy="fedbss", fedbss_epochs=0).validate()


def test_cli_takes_the_local_policy(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sim", "--dataset", "digits", "--agents", "3",
                                      "--rounds", "1", "--local-policy", "bogus",
                                      "--out", str(tmp_path), "--no-plots"])
    assert result.exit_code == 2
    assert "local policy" in result.output
