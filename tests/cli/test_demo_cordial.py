"""`peerd demo --mode cordial`: what each daemon is configured with is a valid cordial config,
the demo's summary reads the test accuracy from the views status, and ``--isolated`` is
refused outside cordial mode."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.control.status import Status, ViewsStatus
from peerd.daemon.config import loads_config
from peerd.mesh import cordial as mesh
from peerd.mesh.localmesh import _tables
from tests.daemon.helpers import ADMIN_HEX, FLEET_HEX, sample_status

runner = CliRunner(env={"COLUMNS": "200"})


@pytest.mark.parametrize("task", mesh.TASKS)
@pytest.mark.parametrize("isolated", [False, True])
def test_the_demo_configures_valid_cordial_daemons(isolated: bool, task: str) -> None:
    cfg = loads_config({"fleet": {"admin_public_key": ADMIN_HEX, "fleet_id": FLEET_HEX},
                        "learning": mesh.cordial_learning(4, isolated=isolated),
                        "task": {"name": task, "node_index": 3, "node_count": 4}})
    assert cfg.learning.mode == "cordial"
    assert cfg.learning.cordial.coordination is not isolated
    assert cfg.learning.capacity == 3
    assert cfg.deprecations == ()


def test_the_mesh_writes_a_mode_table_as_a_nested_table() -> None:
    lines = _tables("learning", mesh.cordial_learning(4, isolated=True))
    assert lines == ["[learning]", 'mode = "cordial"', "capacity = 3", "batch_size = 65",
                     "local_steps = 4", "[learning.cordial]", "warmup_epochs = 20",
                     "coordination = false"]
    data = tomllib.loads("\n".join(lines))
    assert data["learning"]["cordial"] == {"warmup_epochs": 20, "coordination": False}


def test_mean_test_accuracy_of_the_nodes_that_report_one() -> None:
    def with_acc(acc: float | None) -> Status:
        views = ViewsStatus(agent=0, agents=2, ids=675, coordination=True, epoch=1.0,
                            test_accuracy=acc, test_loss=None, peers=())
        return dataclasses.replace(sample_status(), views=views)

    statuses = [with_acc(0.5), with_acc(None), None, sample_status(), with_acc(0.75)]
    assert mesh.test_accuracies(statuses) == [0.5, 0.75]
    assert mesh.mean_test_accuracy(statuses) == 0.625
    assert mesh.mean_test_accuracy([sample_status(), None]) is None


def test_isolated_is_for_cordial_mode_only() -> None:
    result = runner.invoke(app, ["demo", "--isolated"])
    assert result.exit_code == 2
    assert "--isolated is for --mode cordial" in result.output


@pytest.mark.parametrize(("args", "why"), [
    (["--task", "fashion-mnist"], "Pairwise-10 composites of digits or mnist only"),
    (["--model", "linear"], "--model is for weight-mode daemons"),
])
def test_cordial_mode_refuses_what_it_would_ignore(args: list[str], why: str) -> None:
    result = runner.invoke(app, ["demo", "--mode", "cordial", *args])
    assert result.exit_code == 2
    assert why in result.output
