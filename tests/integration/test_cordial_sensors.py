"""Cordial mode on time buckets between real daemons in network namespaces.

Three `peerd run` processes are the three agents of the sensor task (`[task] name =
"sensors"`): each observes its own part of the same moments, aligned by time bucket, and
learns from the other two's views (mDNS on, 1 s buckets, 1 s rounds). Every node must come to
hold both peers' views, covering its window but for the newest bucket or two, and use them,
with nothing refused. That the views make the loss fall below an isolated agent's is the
learner's test (tests/learn/test_sensorround.py); here, that daemons deliver them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.mesh import Node, make_fleet, start, status, wait_for
from tests.net.netns import NetnsHost

pytestmark = pytest.mark.integration

AGENTS = 3
WINDOW = 16
LEARNING = {"mode": "cordial", "round_interval_s": 1.0, "capacity": AGENTS - 1,
            "batch_size": 8, "local_steps": 4, "cordial_bucket_s": 1.0,
            "cordial_window": WINDOW}
TASK = {"name": "sensors", "node_count": AGENTS, "seed": 3}
#: Buckets of the window a peer's view may lack: the node's newest one, or two when the
#: peer's last round came just before a bucket boundary and ours just after the next.
LAG = 2


def test_sensor_agents_exchange_views_of_the_same_moments(
    tmp_path: Path, running: list[Node], lan: Callable[[int], list[NetnsHost]]
) -> None:
    nodes = make_fleet(tmp_path, AGENTS, hosts=lan(AGENTS), mdns=True, learning=LEARNING,
                       task=TASK)
    start(nodes, running)

    def covered(node: Node) -> bool:
        s = node.status()
        if s is None or s["views"] is None or s["node"]["round"] < WINDOW:
            return False
        rows = s["views"]["peers"]
        return len({r["agent"] for r in rows}) == AGENTS - 1 and all(
            r["used"] and r["ids"] >= WINDOW - LAG for r in rows)

    wait_for(lambda: all(covered(n) for n in nodes), 180,
             f"every agent to use both peers' views over its {WINDOW}-bucket window", nodes)
    for i, node in enumerate(nodes):
        s = status(node)
        views = s["views"]
        assert (views["agent"], views["agents"], views["ids"]) == (i, AGENTS, WINDOW)
        assert views["coordination"] is True
        others = {n.id: j for j, n in enumerate(nodes) if n is not node}
        assert {r["origin"]: r["agent"] for r in views["peers"]} == others
        assert all(r["group"] == f"agent-{others[r['origin']]}" for r in s["cache"])
        assert views["test_loss"] is not None
        assert math.isfinite(views["test_loss"])
        assert s["rejected"] == {}
