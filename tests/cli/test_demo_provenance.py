"""`peerd demo --json` names the run behind its summary (issue 28, item 2: the summaries
docs/tasks.md quotes must carry their commit and full command)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.sim import provenance


def _record(stdout: str) -> dict[str, Any]:
    record = json.loads(stdout.strip().splitlines()[-1])["provenance"]
    assert record["commit"] == provenance.git_state().commit
    assert record["machine"]["cores"]
    assert record["wall_s"] >= 0.0
    return dict(record)


def test_an_in_process_summary_records_the_command_with_its_defaults() -> None:
    result = CliRunner().invoke(app, ["demo", "--in-process", "--nodes", "2", "--rounds", "1",
                                      "--json"])
    assert result.exit_code == 0, result.output
    record = _record(result.stdout)
    command = record["command"]
    assert command[:2] == ["peerd", "demo"]
    # Never typed, spelled out: the default task and mode.
    assert command[command.index("--task") + 1] == "digits"
    assert command[command.index("--mode") + 1] == "weights"
    assert "--in-process" in command
    assert "--isolated" not in command
    assert record["args"]["nodes"] == 2


def test_a_mesh_summary_records_the_task_its_mode_chose(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from peerd.cli import demo
    from peerd.mesh import cordial, localmesh, netns

    @contextlib.contextmanager
    def no_daemons(*args: object, **kwargs: object) -> Iterator[list[object]]:
        yield []

    # The mesh itself is the integration tests'; here only what the summary carries.
    monkeypatch.setattr(netns, "unavailable", lambda: "not in this test")
    monkeypatch.setattr(localmesh, "local_mesh", no_daemons)
    monkeypatch.setattr(demo, "_watch", lambda *args: [])
    result = CliRunner().invoke(app, ["demo", "--mode", "cordial", "--isolated", "--rounds",
                                      "3", "--round-interval", "1", "--json"])
    assert result.exit_code == 0, result.output
    command = _record(result.stdout)["command"]
    assert command[command.index("--task") + 1] == cordial.TASK
    assert command[command.index("--mode") + 1] == "cordial"
    assert command[command.index("--round-interval") + 1] == "1.0"
    assert "--isolated" in command
    assert "--model" not in command  # unset: leaving it out gives None again
