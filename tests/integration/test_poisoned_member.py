"""Issue 15's scenario: a fleet member with a valid key publishes sign-flipped models
(tests/integration/attacker.py). With ``blend = "clipped:τ"`` the honest daemons learn about
as well as a mesh without it, and ``peerd audit`` shows what the attacker counted for.

Real `peerd run` processes in network namespaces, found by mDNS. The honest nodes have the
same data in both meshes (``node_count`` = the honest nodes), so the attacker is the only
difference. The full comparison is slow; the short variant only checks the audit and that the
honest nodes' models stay useful.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.mesh import (
    Node,
    cached_origins,
    make_fleet,
    peerd,
    start,
    status,
    wait_for,
    write_overrides,
)
from tests.net.netns import NetnsHost

BLEND = "clipped:1.0"
#: Update-norm validation beside the rule: an entry whose ‖x_j − x_own‖ is over 4 × the
#: median of recent ones is left out and α renormalised over the rest. Clipping alone keeps
#: the attacker's weight small but not its share of α (the own model takes it), and measured
#: 13.6 points (τ = 1.0) and 15.6 points (τ = 0.3) below the clean mesh here (one run each
#: of the slow test with ``VALIDATION = {}``).
VALIDATION = {"update_norm": "reject"}
ATTACKER_TASK = "tests.integration.attacker:task"
#: How far the mean validation accuracy of the honest nodes may fall below the mesh without
#: the attacker (the issue's bar: 5 points).
MAX_ACCURACY_LOSS = 0.05


def _mesh(tmp_path: Path, hosts: list[NetnsHost], running: list[Node], *, honest: int,
          attacker: bool, port: int) -> tuple[list[Node], Node | None]:
    n = honest + attacker
    nodes = make_fleet(tmp_path, n, hosts=hosts[:n], mdns=True, base_port=port,
                       learning={"blend": BLEND}, task={"node_count": honest})
    for x in nodes:
        write_overrides(x.config, validation=VALIDATION)
    bad = nodes[-1] if attacker else None
    if bad is not None:  # its own data and model; rho = 0: its x̄ is the flipped entry
        write_overrides(bad.config, task={"name": ATTACKER_TASK, "node_index": 0,
                                          "node_count": 1}, learning={"rho": 0.0})
    start(nodes, running)
    good = [x for x in nodes if x is not bad]
    for me in good:
        others = {x.id for x in nodes if x is not me}
        wait_for(lambda me=me, others=others: others <= cached_origins(me),  # type: ignore[misc]
                 180, "every honest node to cache every other node", nodes)
    return good, bad


def _after_rounds(nodes: list[Node], k: int, everyone: list[Node]) -> list[dict[str, Any]]:
    """The honest nodes' statuses once each ran ``k`` more rounds with full caches."""
    target = {x.id: status(x)["node"]["round"] + k for x in nodes}
    for x in nodes:
        wait_for(lambda x=x: status(x)["node"]["round"] >= target[x.id],  # type: ignore[misc]
                 60 + 6 * k, f"{k} more rounds", everyone)
    return [status(x) for x in nodes]


def _audit_of(node: Node) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(peerd("audit", "--json", "--socket",
                                           str(node.socket)).stdout)
    return doc


def _check_attacker_in_audit(good: list[Node], bad: Node) -> None:
    """Every honest node's audit lists the attacker with its α, a clipped weight far below
    it, and a drift far above the honest members'."""
    for me in good:
        records = [r for r in _audit_of(me)["records"]
                   if bad.id in {m["origin"] for m in r["members"]}]
        assert records, f"{me.name} never blended the attacker"
        rec = records[-1]
        members = {m["origin"]: m for m in rec["members"]}
        att = members[bad.id]
        honest = [m for o, m in members.items() if o not in (me.id, bad.id)]
        print(f"{me.name} round {rec['round']}: attacker α {att['alpha']:.3f} weight "
              f"{att['weight']:.4f} drift {att['drift']:.2f}; honest drifts "
              f"{[round(m['drift'], 2) for m in honest]}")
        assert att["alpha"] is not None
        assert att["alpha"] > 0
        assert att["weight"] is not None
        assert att["weight"] < att["alpha"] / 2
        assert att["update_norm"] is not None
        assert att["drift"] is not None
        assert all(m["drift"] is not None and att["drift"] > 3 * m["drift"] for m in honest)


def _mean_accuracy(statuses: list[dict[str, Any]]) -> float:
    accs = [s["node"]["val_accuracy"] for s in statuses]
    assert all(a is not None for a in accs)
    return float(sum(accs)) / len(accs)


def _mean_accuracy_over_last(nodes: list[Node], k: int, last: int, everyone: list[Node]
                             ) -> float:
    """The honest nodes' mean validation accuracy over ``last`` rounds ending ``k`` rounds
    from now. A non-IID node's accuracy moves a few points from one round to the next with
    what its blend held; one snapshot per mesh failed the 5-point bar once in CI
    (0.891 vs 0.941) where a rerun gave 0.916 vs 0.930."""
    first = k - last + 1
    samples = [_mean_accuracy(_after_rounds(nodes, first, everyone))]
    samples += [_mean_accuracy(_after_rounds(nodes, 1, everyone)) for _ in range(last - 1)]
    return sum(samples) / len(samples)


def test_clipping_keeps_a_sign_flipping_member_out_short(
    tmp_path: Path, lan: Callable[[int], list[NetnsHost]], running: list[Node]
) -> None:
    good, bad = _mesh(tmp_path, lan(3), running, honest=2, attacker=True, port=4011)
    assert bad is not None
    statuses = _after_rounds(good, 3, [*good, bad])
    _check_attacker_in_audit(good, bad)
    # Not collapsed: a flipped model blended at α would leave chance accuracy (~0.1).
    assert _mean_accuracy(statuses) > 0.5


# In-process in the default run (tests/daemon/test_poisoned_inproc.py): the blend rule's
# and the validation's result, not the network's. Here on real daemons with `-m long`.
@pytest.mark.long
def test_clipping_keeps_honest_accuracy_within_5_points_of_a_clean_mesh(
    tmp_path: Path, lan: Callable[[int], list[NetnsHost]], running: list[Node]
) -> None:
    rounds = 20
    hosts = lan(4)
    good, bad = _mesh(tmp_path / "attacked", hosts, running, honest=3, attacker=True,
                      port=4011)
    assert bad is not None
    attacked = _mean_accuracy_over_last(good, rounds, 5, [*good, bad])
    _check_attacker_in_audit(good, bad)
    for me in good:  # once the norms' median is known, its entries are refused, by reason
        records = _audit_of(me)["records"]
        assert {"peer": bad.id, "reason": "update_norm_too_large", "count": 1} in [
            x for r in records for x in r["refused"]]
        last = {m["origin"]: m for m in records[-1]["members"]}
        assert last[bad.id]["verdict"] == "rejected"
        assert last[bad.id]["weight"] == 0.0
    for x in [*good, bad]:
        x.stop()
    clean_nodes, _ = _mesh(tmp_path / "clean", hosts, running, honest=3, attacker=False,
                           port=4011)
    clean = _mean_accuracy_over_last(clean_nodes, rounds, 5, clean_nodes)
    print(f"honest mean val accuracy over rounds {rounds - 4}-{rounds}: attacked {attacked:.3f}, "
          f"clean {clean:.3f}")
    assert attacked >= clean - MAX_ACCURACY_LOSS
