"""`peerd sim`'s smaller options (issue 18, item 4): `--capacity unlimited`, `--stats-from`,
what it says it wrote, and `--help`'s τ_max convention."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.sim.runner import RoundRecord, SimConfig, SimResult

SMALL = ["sim", "--dataset", "digits", "--agents", "4", "--rounds", "2", "--local-steps", "1",
         "--eval-samples", "50", "--algorithms", "cached-dfl", "--no-plots"]


def _record(round_no: int, models: float, age: float) -> RoundRecord:
    return RoundRecord(round=round_no, algorithm="cached-dfl", accuracy_mean=0.5,
                       accuracy_std=0.0, accuracy_min=0.5, accuracy_max=0.5, train_loss=1.0,
                       drift_mean=0.1, cache_avg_models=models, cache_avg_age=age,
                       contacts=1, seconds=0.0)


def test_stats_from_leaves_the_fill_up_rounds_out_of_the_cache_averages() -> None:
    records = [_record(1, 1.0, 0.0), _record(2, 3.0, 1.0), _record(3, 5.0, 2.0)]
    every = SimResult(SimConfig(algorithms=("cached-dfl",)), records).summary()
    steady = SimResult(SimConfig(algorithms=("cached-dfl",), stats_from=2), records).summary()
    assert every["results"]["cached-dfl"]["cache_avg_models"] == 3.0
    assert steady["results"]["cached-dfl"]["cache_avg_models"] == 4.0
    assert steady["results"]["cached-dfl"]["cache_avg_age"] == 1.5
    assert steady["config"]["stats_from"] == 2


def test_capacity_unlimited_is_the_number_of_agents(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [*SMALL, "--capacity", "unlimited", "--json",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"]["capacity"] == 4


def test_a_bad_capacity_or_stats_from_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for bad in (["--capacity", "lots"], ["--stats-from", "0"]):
        result = CliRunner().invoke(app, [*SMALL, *bad, "--out", str(tmp_path)])
        assert result.exit_code == 2, result.output
        assert len(result.output.strip().splitlines()) == 1
        assert "error" in result.output


def test_no_plots_says_it_wrote_metrics_only(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [*SMALL, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"wrote metrics to {tmp_path}" in result.stdout
    assert "and plots" not in result.stdout


def test_help_states_the_tau_max_convention() -> None:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["sim", "--help"])
    assert "t − τ ≤ τ_max" in result.stdout
    assert "unlimited" in result.stdout
