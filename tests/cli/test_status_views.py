"""`peerd status` in cordial mode: a views table (agent, origin, ids covered, used); the JSON
codec carries the views block; other modes print none."""

from __future__ import annotations

import dataclasses
import io

from rich.console import Console

from peerd.cli.status import render_status
from peerd.control.status import Status, ViewRow, ViewsStatus, from_json, to_json
from tests.daemon.helpers import sample_status

PEER_A = "12D3KooWAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
PEER_B = "12D3KooWBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"


def rendered(status: Status) -> str:
    out = io.StringIO()
    render_status(Console(file=out, width=200, color_system=None), status)
    return out.getvalue()


def cordial_status() -> Status:
    views = ViewsStatus(agent=1, agents=4, ids=675, coordination=True, epoch=12.5,
                        test_accuracy=0.875, test_loss=0.4, peers=(
                            ViewRow(origin=PEER_A, agent=0, version=9, age_s=1.5, ids=675,
                                    used=True),
                            ViewRow(origin=PEER_B, agent=None, version=3, age_s=4.0, ids=300,
                                    used=False)))
    return dataclasses.replace(sample_status(), views=views)


def test_views_show_agent_coverage_and_use() -> None:
    text = rendered(cordial_status())
    assert "views: agent 1 of 4, 675 ids, coordination on" in text
    assert "test accuracy 0.875" in text
    assert "675/675" in text
    assert "300/675" in text
    assert "…AAAAAA" in text
    assert "yes" in text
    assert "no" in text


def test_a_regression_shows_its_test_loss() -> None:
    status = cordial_status()
    assert status.views is not None
    sensors = dataclasses.replace(status.views, test_accuracy=None, test_loss=0.01234)
    text = rendered(dataclasses.replace(status, views=sensors))
    assert "test loss 0.0123" in text
    assert "test accuracy" not in text


def test_other_modes_print_no_views() -> None:
    assert "views:" not in rendered(sample_status())


def test_views_survive_the_json_codec() -> None:
    s = cordial_status()
    encoded = to_json(s)
    assert encoded["views"]["peers"][1] == {"origin": PEER_B, "agent": None, "version": 3,
                                            "age_s": 4.0, "ids": 300, "used": False}
    assert from_json(encoded) == s
    assert to_json(sample_status())["views"] is None
