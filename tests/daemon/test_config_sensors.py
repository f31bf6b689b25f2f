"""``[learning] mode = "sensors"`` and its ``[learning.cordial]`` keys: parsed, validated,
one-line errors; the old form (``mode = "cordial"`` with ``[task] name = "sensors"``) still
starts, with a deprecation notice; `peerd run` stops at exit 2 on a bad value and logs each
deprecation as one warning line."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.core.modes import ModeName
from peerd.daemon.config import ConfigError, load_config, loads_config
from tests.daemon.helpers import ADMIN_HEX, FLEET_HEX

OLD_FORM = ('[learning] mode = "cordial" with [task] name = "sensors" is deprecated: use '
            '[learning] mode = "sensors" (and leave [task] name out)')


def doc(learning: dict[str, Any], task: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"fleet": {"admin_public_key": ADMIN_HEX, "fleet_id": FLEET_HEX},
            "learning": {"mode": "sensors", "capacity": 3, **learning},
            "task": {"node_index": 1, "node_count": 3, **(task or {})}}


def test_sensor_keys_and_their_defaults() -> None:
    cfg = loads_config(doc({"cordial": {"bucket_s": 2.5, "window": 16}}))
    assert (cfg.learning.mode, cfg.task.name) == (ModeName.SENSORS, "sensors")
    assert cfg.deprecations == ()
    assert (cfg.learning.cordial.bucket_s, cfg.learning.cordial.window) == (2.5, 16)
    assert loads_config(doc({"cordial": {"bucket_s": 0.01, "window": 4096}}))
    defaults = loads_config(doc({})).learning.cordial
    assert (defaults.bucket_s, defaults.window) == (10.0, 64)
    # An odd number of sensors is fine (Pairwise-10 needs digit pairs; sensors do not).
    assert loads_config(doc({}, {"node_count": 3, "node_index": 2})).task.node_count == 3
    # Naming the task as well is allowed; with no [task] section at all, it is implied too.
    assert loads_config(doc({}, {"name": "sensors"})).task.name == "sensors"
    lone = loads_config({"fleet": doc({})["fleet"], "learning": {"mode": "sensors"},
                         "task": {"node_count": 2}})
    assert lone.task.name == "sensors"


def test_the_old_form_is_the_same_config_with_notices() -> None:
    old = loads_config(doc({"mode": "cordial", "cordial_bucket_s": 2.5, "cordial_window": 16},
                           {"name": "sensors"}))
    new = loads_config(doc({"cordial": {"bucket_s": 2.5, "window": 16}}))
    assert (old.learning, old.task) == (new.learning, new.task)
    assert old.learning.mode is ModeName.SENSORS
    assert old.deprecations == (
        OLD_FORM,
        "[learning] cordial_bucket_s is deprecated: use [learning.cordial] bucket_s",
        "[learning] cordial_window is deprecated: use [learning.cordial] window")


@pytest.mark.parametrize(("learning", "task", "message"), [
    ({"cordial": {"bucket_s": 0}}, None,
     "[learning.cordial] bucket_s: must be a finite number > 0"),
    ({"cordial": {"bucket_s": -1.0}}, None, "[learning.cordial] bucket_s:"),
    ({"cordial": {"bucket_s": "10s"}}, None, "[learning.cordial] bucket_s:"),
    ({"cordial": {"window": 3}}, None,
     "[learning.cordial] window: must be an integer in [4, 4096]"),
    ({"cordial": {"window": 4097}}, None, "[learning.cordial] window:"),
    ({"cordial": {"window": 4.5}}, None, "[learning.cordial] window:"),
    ({"cordial_window": 3}, None, "[learning] cordial_window: must be an integer in [4, 4096]"),
    # 600 s of staleness in 10 ms buckets: 60,000 buckets of lag + 4,096 + 1 fit 65,536 ids;
    # in 9 ms buckets 66,667 do not.
    ({"cordial": {"bucket_s": 0.009, "window": 4}}, None,
     "[learning.cordial] window: 4 buckets plus tau_max / bucket_s = 600 / 0.009 must "
     "stay under 65536 bucket ids"),
    ({}, {"node_count": 1, "node_index": 0}, '[task] node_count: mode = "sensors" needs >= 2 '
                                             "agents, got 1"),
    ({"capacity": 1}, None, "[learning] capacity: must be >= node_count - 1 = 2"),
    ({}, {"name": "mnist"}, '[task] name: mode = "sensors" trains on the time-bucket sensors '
                            "(leave name out), got 'mnist'"),
    ({"mode": "weights"}, {"name": "sensors"},
     '[task] name: "sensors" runs in [learning] mode = "sensors" only'),
    ({"mode": "knowledge"}, {"name": "sensors"},
     '[task] name: "sensors" runs in [learning] mode = "sensors" only'),
])
def test_bad_sensor_settings_are_one_line_errors(learning: dict[str, Any],
                                                 task: dict[str, Any] | None,
                                                 message: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads_config(doc(learning, task))
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_peerd_run_stops_with_exit_2_and_one_line(tmp_path: Path) -> None:
    path = tmp_path / "peerd.toml"
    path.write_text(f'[fleet]\nadmin_public_key = "{ADMIN_HEX}"\nfleet_id = "{FLEET_HEX}"\n'
                    '[learning]\nmode = "sensors"\n[learning.cordial]\nwindow = 2\n'
                    '[task]\nnode_count = 2\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    result = CliRunner().invoke(app, ["run", "--config", str(path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"peerd: {info.value}"
    assert "[learning.cordial] window:" in result.stderr


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
