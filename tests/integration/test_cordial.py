"""Cordial mode between real daemons in network namespaces: views carry what one digit alone
cannot tell.

Two `peerd run` processes are the two agents of Pairwise-10 composite MNIST (P = 25: agent 0
sees digit a, agent 1 digit 10 − a of the same composites, ids aligned by the shared
index's seed). mDNS on. Every node must hold the other's view for all 675 ids and use it,
and end ``ROUNDS`` rounds with a test accuracy at least ``GAP`` above the same agent trained
without views. "Without views" is computed here, in-process, by the very code the daemon
runs (:class:`peerd.learn.cordialround.CordialLearner`) with the same data, seed and
settings but no peer: until the first view arrives the daemon's round *is* that run, bit for
bit (checked), so the two differ by the views alone. The measured gaps are in docs/tasks.md
("Cordial", from ``benchmarks.cordial_mesh_runs``); 5 is the margin the issue asks of the
4-daemon demo.

The default run has the smoke (a few rounds: views delivered, used, nothing refused, the
baseline identical until then); the 40 rounds with the accuracy gap run in-process there
(tests/daemon/test_cordial_inproc.py), and here with ``-m long``.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from peerd.control.status import Status
from peerd.learn.cordialround import CordialLearner, agent_data, index_size
from peerd.mesh import cordial as demo
from peerd.mesh.localmesh import MeshNode, local_mesh
from tests.integration.mesh import Node, make_fleet, start, status, wait_for
from tests.net.netns import NetnsHost, skip_reason

pytestmark = pytest.mark.integration

ROUNDS = 40
#: Enough for a view to arrive and be used on both agents (usually by round 2 or 3).
SMOKE_ROUNDS = 4
GAP = 0.05
WARMUP = 5
LEARNING = {"mode": "cordial", "round_interval_s": 1.0, "capacity": 1, "batch_size": 65,
            "local_steps": 4, "cordial_warmup_epochs": WARMUP}
TASK = {"name": "mnist", "node_count": 2, "seed": 0}
ROUND_LINE = re.compile(r"round (\d+): version \d+, epoch [\d.]+, loss [\d.na]+, val acc "
                        r"[\d.]+, test acc ([\d.]+), views of (\d+)/1 peer agents")


def curve(node: Node) -> dict[int, tuple[float, int]]:
    """Round -> (test accuracy, peer views used), from the daemon's log."""
    return {int(m[1]): (float(m[2]), int(m[3])) for m in ROUND_LINE.finditer(node.logs())}


def alone(index: int, rounds: int) -> list[float]:
    """The daemon's cordial round without any view, for ``rounds`` rounds."""
    torch.set_num_threads(1)  # as the daemon trains ([node] torch_threads = 1)
    learner = CordialLearner(agent_data(2, index, 25, 0), warmup_epochs=WARMUP,
                             batch_size=65, steps=4, seed=0)
    return [learner.round([]).test_accuracy for _ in range(rounds)]


def two_agents(tmp_path: Path, running: list[Node], hosts: list[NetnsHost], rounds: int,
               compare: bool) -> None:
    """Both agents run ``rounds`` rounds: each holds and uses the other's view, refuses
    nothing, and until its first view computed exactly what it computes alone; with
    ``compare``, the views also lift the test accuracy at ``rounds`` by ``GAP``."""
    nodes = make_fleet(tmp_path, 2, hosts=hosts, mdns=True, learning=LEARNING, task=TASK)
    start(nodes, running)
    ids = index_size(25)
    baselines = [alone(i, rounds) for i in range(2)]  # while the daemons train

    def settled() -> bool:
        for node in nodes:
            s = node.status()
            if s is None or s["node"]["round"] < rounds or s["views"] is None:
                return False
            if not any(row["used"] for row in s["views"]["peers"]):
                return False
        return True

    wait_for(settled, 300, f"{rounds} rounds on both agents, each using a view", nodes)
    report = []
    for i, node in enumerate(nodes):
        s = status(node)
        other = nodes[1 - i]
        views = s["views"]
        assert (views["agent"], views["agents"], views["ids"]) == (i, 2, ids)
        assert views["coordination"] is True
        (row,) = views["peers"]
        assert (row["origin"], row["agent"], row["ids"], row["used"]) == (other.id, 1 - i,
                                                                           ids, True)
        assert s["cache"][0]["kind"] == "knowledge"  # a view is a knowledge entry ...
        assert s["cache"][0]["group"] == f"agent-{1 - i}"  # ... naming its agent
        assert s["rejected"] == {}
        together = curve(node)
        last = max(together, default=0)  # the newest round line, a view used by then
        assert set(range(1, max(last, rounds) + 1)) <= set(together), node.logs()[-2000:]
        baseline = baselines[i]
        for r in range(1, rounds + 1):  # no view yet: the very computation of the baseline
            if together[r][1] > 0:
                break
            assert abs(together[r][0] - baseline[r - 1]) <= 5e-4, (together, baseline)
        assert together[last][1] == 1
        if compare:
            assert together[rounds][1] == 1
        report.append((together[rounds][0], baseline[-1]))
    print(f"test accuracy at round {rounds} (with views, without):", report)  # with -s
    if compare:
        with_views = statistics.mean(r[0] for r in report)
        without = statistics.mean(r[1] for r in report)
        assert with_views >= without + GAP, report


def test_two_real_daemons_exchange_and_use_views(
    tmp_path: Path, running: list[Node], lan: Callable[[int], list[NetnsHost]]
) -> None:
    # The cordial mode's real-daemon smoke: mDNS, libp2p and the control socket carry
    # views. What views are worth (40 rounds, a gap to learning alone) is
    # tests/daemon/test_cordial_inproc.py's, in-process; its real-daemon form is below.
    two_agents(tmp_path, running, lan(2), SMOKE_ROUNDS, compare=False)


@pytest.mark.long
def test_two_agents_exchange_views_and_beat_learning_without_them(
    tmp_path: Path, running: list[Node], lan: Callable[[int], list[NetnsHost]]
) -> None:
    two_agents(tmp_path, running, lan(2), ROUNDS, compare=True)


def mesh_accuracy(root: Path, *, isolated: bool, rounds: int) -> float:
    """``peerd demo --mode cordial --nodes 4 --task mnist``'s mesh (same settings) for
    ``rounds`` rounds: the mean of the nodes' test accuracy in their last status."""
    learning = {**demo.cordial_learning(4, isolated=isolated), "round_interval_s": 1.0}
    # MNIST, as when the gaps in docs/tasks.md were measured (the demo's default is digits).
    with local_mesh(root, 4, task="mnist", use_netns=True, learning=learning) as nodes:
        last: list[Status | None] = [None] * 4

        def done() -> bool:
            last[:] = [n.poll() for n in nodes]
            return all(s is not None and s.node.round >= rounds for s in last)

        wait_for(done, 900, f"{rounds} rounds on 4 cordial daemons", _as_nodes(nodes))
        acc = demo.mean_test_accuracy(last)
    assert acc is not None
    return acc


def _as_nodes(nodes: list[MeshNode]) -> list[Node]:
    # wait_for reads .name, .proc and .logs() of each: a MeshNode has the last two.
    return [Node(f"node{n.index}", n.dir, n.id, n.port, None, n.proc) for n in nodes]


@pytest.mark.long
def test_four_daemons_with_views_beat_the_same_daemons_isolated(tmp_path: Path) -> None:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    rounds = 60
    cordial = mesh_accuracy(tmp_path / "cordial", isolated=False, rounds=rounds)
    isolated = mesh_accuracy(tmp_path / "isolated", isolated=True, rounds=rounds)
    print(f"4 daemons, {rounds} rounds: mean test accuracy {cordial:.3f} with views, "
          f"{isolated:.3f} isolated")
    assert cordial >= isolated + GAP
