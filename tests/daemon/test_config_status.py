"""What the status says runs (issue 25, item 3): ``Config.status_config``'s mode, blend rule
and local policy for every mode and policy, from the config a node starts with."""

from __future__ import annotations

from typing import Any

import pytest

from peerd.core.modes import ModeName
from peerd.daemon.config import loads_config
from tests.daemon.helpers import ADMIN_HEX, FLEET_HEX


def runs(learning: dict[str, Any], task: dict[str, Any] | None = None) -> tuple[str, str, str]:
    cfg = loads_config({"fleet": {"admin_public_key": ADMIN_HEX, "fleet_id": FLEET_HEX},
                        "learning": learning, **({"task": task} if task else {})})
    status = cfg.status_config()
    return status.mode, status.blend, status.local_policy


CORDIAL = {"mode": "cordial", "capacity": 3}


@pytest.mark.parametrize(("learning", "task", "expected"), [
    ({}, None, ("weights", "weighted", "plain")),
    ({"blend": "median"}, None, ("weights", "median", "plain")),
    ({"blend": "krum:2", "capacity": 8}, None, ("weights", "krum:2", "plain")),
    ({"local_policy": "fedbss"}, None, ("weights", "weighted", "fedbss")),
    ({"blend": "clipped:0.5", "local_policy": "fedbss"}, None,
     ("weights", "clipped:0.5", "fedbss")),
    # Knowledge mode keeps blend and local_policy at their defaults and runs neither.
    ({"mode": "knowledge"}, None, ("knowledge", "none", "distillation")),
    (CORDIAL, {"name": "mnist", "node_index": 1, "node_count": 4},
     ("cordial", "none", "two-time-scale")),
    # The sensor variant is chosen by the task today; the status names it as a mode.
    (CORDIAL, {"name": "sensors", "node_index": 1, "node_count": 3},
     ("sensors", "none", "two-time-scale")),
])
def test_the_status_names_the_mode_blend_and_local_policy_that_run(
    learning: dict[str, Any], task: dict[str, Any] | None, expected: tuple[str, str, str],
) -> None:
    assert runs(learning, task) == expected


def test_every_mode_name_is_one_a_config_can_run() -> None:
    seen = {runs({})[0], runs({"mode": "knowledge"})[0],
            runs(CORDIAL, {"name": "mnist", "node_index": 1, "node_count": 4})[0],
            runs(CORDIAL, {"name": "sensors", "node_index": 1, "node_count": 3})[0]}
    assert seen == {m.value for m in ModeName}
