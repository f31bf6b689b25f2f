"""``[task] name = "sensors"`` in ``[learning] mode = "cordial"`` and its keys: parsed, validated,
one-line errors; `peerd run` stops at exit 2 on a bad one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.daemon.config import ConfigError, load_config, loads_config
from tests.daemon.helpers import ADMIN_HEX, FLEET_HEX


def doc(learning: dict[str, Any], task: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"fleet": {"admin_public_key": ADMIN_HEX, "fleet_id": FLEET_HEX},
            "learning": {"mode": "cordial", "capacity": 3, **learning},
            "task": {"name": "sensors", "node_index": 1, "node_count": 3, **(task or {})}}


def test_sensor_keys_and_their_defaults() -> None:
    cfg = loads_config(doc({"cordial_bucket_s": 2.5, "cordial_window": 16}))
    assert cfg.task.name == "sensors"
    assert (cfg.learning.cordial_bucket_s, cfg.learning.cordial_window) == (2.5, 16)
    assert loads_config(doc({"cordial_bucket_s": 0.01, "cordial_window": 4096}))
    defaults = loads_config(doc({})).learning
    assert (defaults.cordial_bucket_s, defaults.cordial_window) == (10.0, 64)
    # An odd number of sensors is fine (Pairwise-10 needs digit pairs; sensors do not).
    assert loads_config(doc({}, {"node_count": 3, "node_index": 2})).task.node_count == 3


@pytest.mark.parametrize(("learning", "task", "message"), [
    ({"cordial_bucket_s": 0}, None, "[learning] cordial_bucket_s: must be a finite number > 0"),
    ({"cordial_bucket_s": -1.0}, None, "[learning] cordial_bucket_s:"),
    ({"cordial_bucket_s": "10s"}, None, "[learning] cordial_bucket_s:"),
    ({"cordial_window": 3}, None, "[learning] cordial_window: must be an integer in [4, 4096]"),
    ({"cordial_window": 4097}, None, "[learning] cordial_window:"),
    ({"cordial_window": 4.5}, None, "[learning] cordial_window:"),
    # 600 s of staleness in 10 ms buckets: 60,000 buckets of lag + 4,096 + 1 fit 65,536 ids;
    # in 9 ms buckets 66,667 do not.
    ({"cordial_bucket_s": 0.009, "cordial_window": 4}, None,
     "[learning] cordial_window: 4 buckets plus tau_max / cordial_bucket_s = 600 / 0.009 must "
     "stay under 65536 bucket ids"),
    ({}, {"node_count": 1, "node_index": 0}, '[task] node_count: mode = "cordial" needs >= 2 '
                                             "agents, got 1"),
    ({"capacity": 1}, None, "[learning] capacity: must be >= node_count - 1 = 2"),
    ({"mode": "weights"}, None, '[task] name: "sensors" runs in [learning] mode = "cordial" '
                                "only"),
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
                    '[learning]\nmode = "cordial"\ncordial_window = 2\n'
                    '[task]\nname = "sensors"\nnode_count = 2\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    result = CliRunner().invoke(app, ["run", "--config", str(path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"peerd: {info.value}"
    assert "[learning] cordial_window:" in result.stderr
