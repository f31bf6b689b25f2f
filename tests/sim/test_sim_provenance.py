"""Every output of `peerd sim` names what produced it (issue 28, item 2): the commit and dirty
state, the command with every default spelled out (so it means the same run after a default
changes), the machine, the date and the wall time."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.sim import provenance

SMALL = ["sim", "--dataset", "digits", "--agents", "4", "--rounds", "2", "--local-steps", "1",
         "--eval-samples", "50", "--algorithms", "cached-dfl", "--no-plots"]


def _head() -> str | None:
    state = provenance.git_state()
    return state.commit


def _check_record(record: dict[str, object]) -> None:
    assert set(record) >= {"commit", "dirty", "command", "command_line", "args", "machine",
                           "date", "wall_s", "peerd_version"}
    assert record["commit"] == _head()
    machine = record["machine"]
    assert isinstance(machine, dict)
    assert machine["cores"]
    assert machine["torch_threads"] >= 1
    assert isinstance(record["wall_s"], float)
    assert record["wall_s"] >= 0.0


def test_the_grid_run_records_its_expanded_command_which_reruns_the_same_config(
        tmp_path: Path) -> None:
    first = CliRunner().invoke(app, [*SMALL, "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    record = metrics["provenance"]
    assert "provenance" not in summary  # byte-identical across engines (docs/simulator.md)
    _check_record(record)
    command = record["command"]
    assert command[:2] == ["peerd", "sim"]
    # Defaults the user never typed are spelled out, with their values.
    assert command[command.index("--lr") + 1] == "0.1"
    assert command[command.index("--batch-size") + 1] == "64"
    assert "--no-plots" in command
    assert "--json" not in command
    assert record["args"]["agents"] == 4
    # Run again from the record (to another folder): the same configuration.
    out_at = command.index("--out")
    again = [*command[1:out_at], "--out", str(tmp_path / "b"), *command[out_at + 2:]]
    second = CliRunner().invoke(app, again)
    assert second.exit_code == 0, second.output
    rerun = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert rerun["config"] == summary["config"]


def test_an_old_spelling_is_recorded_under_its_new_name(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [*SMALL, "--round-seconds", "30", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    command = json.loads((tmp_path / "metrics.json").read_text())["provenance"]["command"]
    assert "--round-seconds" not in command
    assert command[command.index("--round-interval-s") + 1] == "30"


def test_fedcvt_and_cordial_outputs_carry_the_record(tmp_path: Path) -> None:
    out = tmp_path / "fedcvt.json"
    result = CliRunner().invoke(app, ["sim", "fedcvt", "--dataset", "breast_cancer", "--aligned",
                                      "0.2", "--seeds", "0", "--steps", "5", "--hidden", "8",
                                      "--dim", "4", "--warmup-steps", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())["provenance"]
    _check_record(record)
    assert record["command"][:3] == ["peerd", "sim", "fedcvt"]
    assert record["command"][record["command"].index("--sharpen") + 1] == "0.0"

    result = CliRunner().invoke(app, ["sim", "cordial", "--agents", "4", "--distributions",
                                      "gaussian", "--runs", "1", "--iterations", "20", "--out",
                                      str(tmp_path), "--no-plots"])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "cordial-linear.json").read_text())["provenance"]
    _check_record(record)
    assert record["command"][:3] == ["peerd", "sim", "cordial"]
    assert record["command"][record["command"].index("--threads") + 1] == "1"


def test_outside_a_checkout_there_is_no_commit(tmp_path: Path) -> None:
    assert provenance.git_state(tmp_path) == provenance.GitState(None, False, ())
    # Inside another repository (a wheel in a project's venv) its commit is not ours.
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    inner = tmp_path / "site-packages"
    inner.mkdir()
    assert provenance.git_state(inner).commit is None


def test_a_dirty_tree_is_named(tmp_path: Path) -> None:
    if subprocess.run(["git", "--version"], capture_output=True).returncode != 0:
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.txt").write_text("a\n")
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    clean = provenance.git_state(tmp_path)
    assert clean.commit is not None
    assert len(clean.commit) == 40
    assert not clean.dirty
    (tmp_path / "a.txt").write_text("b\n")
    dirty = provenance.git_state(tmp_path)
    assert dirty.commit == clean.commit
    assert dirty.dirty
    assert dirty.dirty_paths == ("a.txt",)


def test_a_fedcache_run_records_it_in_each_checkpoint(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sim", "--dataset", "digits", "--partition",
                                      "dirichlet:1.0", "--agents", "4", "--rounds", "1",
                                      "--algorithms", "fedcache", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "fedcache.json").read_text())["provenance"]
    _check_record(record)
    command = record["command"]
    assert command[command.index("--distill-form") + 1] == "eq18"
    assert command[command.index("--temperature") + 1] == "1.0"  # the form's T, spelled out
    assert command[command.index("--model") + 1] == "large"  # the knowledge runs' default
