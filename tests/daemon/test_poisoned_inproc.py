"""Issue 15's scenario, the accuracy half: a fleet member with a valid key publishes
sign-flipped models (tests/integration/attacker.py); with ``blend = "clipped:τ"`` and
update-norm validation the honest daemons learn within 5 points of a mesh without it, and
the audit shows the attacker refused by reason.

What this checks is the blend rule and the validation, not the network: real ``Daemon``
objects in one process (tests/daemon/inprocfleet.py). The real-daemon form is
tests/integration/test_poisoned_member.py's ``long`` test; its short test (real daemons,
the audit of the attacker, no collapse) stays in the default run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from peerd.control.status import Status
from peerd.daemon.config import Config
from peerd.daemon.config_learning import LearningConfig
from peerd.daemon.daemon import Daemon
from tests.daemon.inprocfleet import Fleet, fleet_configs
from tests.integration.test_poisoned_member import (
    ATTACKER_TASK,
    BLEND,
    MAX_ACCURACY_LOSS,
    VALIDATION,
)

ROUNDS = 20
#: Snapshots averaged (one a round, ending at ROUNDS): one node's accuracy moves a few
#: points from one round to the next with what its blend held.
LAST = 5
#: Rounds for every honest node to hold every other node's entry: one sweep, with margin.
MESH_WITHIN_CYCLES = 3


def _mesh(root: Path, *, honest: int, attacker: bool) -> tuple[Fleet, list[Daemon],
                                                                Daemon | None]:
    n = honest + attacker
    learning = {"blend": BLEND, "local_steps": LearningConfig().local_steps,
                "round_interval_s": 1.0, "tau_max": 120.0}
    cfgs = fleet_configs(root, n, learning=learning, task={"name": "digits",
                                                           "node_count": honest})
    # VALIDATION is the real-daemon test's [validation] table: one key, update_norm.
    assert set(VALIDATION) == {"update_norm"}
    cfgs = [dataclasses.replace(c, validation=dataclasses.replace(
        c.validation, update_norm=VALIDATION["update_norm"])) for c in cfgs]
    if attacker:  # its own data and model; rho = 0: its x̄ is the flipped entry
        cfgs[-1] = _attacker(cfgs[-1])
    fleet = Fleet(cfgs)
    bad = fleet.daemons[-1] if attacker else None
    good = [d for d in fleet.daemons if d is not bad]
    for _ in range(MESH_WITHIN_CYCLES):
        fleet.cycle()
    for me in good:
        others = {d.node.id for d in fleet.daemons if d is not me}
        assert others <= {i.meta.origin for i in me.node.cache}, "not meshed"
    return fleet, good, bad


def _attacker(cfg: Config) -> Config:
    return dataclasses.replace(
        cfg, task=dataclasses.replace(cfg.task, name=ATTACKER_TASK, node_index=0, node_count=1),
        learning=dataclasses.replace(cfg.learning, rho=0.0))


def _mean_accuracy(statuses: list[Status]) -> float:
    accs = [s.node.val_accuracy for s in statuses]
    assert all(a is not None for a in accs)
    return float(sum(a for a in accs if a is not None)) / len(accs)


def _mean_accuracy_over_last(fleet: Fleet, good: list[Daemon]) -> float:
    """The honest nodes' mean validation accuracy over the last ``LAST`` of ``ROUNDS``
    rounds (counted from the mesh's first full cache, as the real-daemon test counts)."""
    samples = []
    for r in range(1, ROUNDS + 1):
        fleet.cycle()
        if r > ROUNDS - LAST:
            samples.append(_mean_accuracy([d.status() for d in good]))
    return sum(samples) / len(samples)


def _records(d: Daemon) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = d.participation.answer(None)["records"]
    return records


def test_clipping_keeps_honest_accuracy_within_5_points_of_a_clean_mesh(
    tmp_path: Path
) -> None:
    fleet, good, bad = _mesh(tmp_path / "attacked", honest=3, attacker=True)
    assert bad is not None
    attacked = _mean_accuracy_over_last(fleet, good)
    for me in good:
        records = _records(me)
        # Every honest node's audit lists the attacker with its α, a clipped weight far
        # below it, and a drift far above the honest members' ...
        with_bad = [r for r in records if bad.node.id in {m["origin"] for m in r["members"]}]
        assert with_bad, f"{me.node.id} never blended the attacker"
        members = {m["origin"]: m for m in with_bad[-1]["members"]}
        att = members[bad.node.id]
        honest = [m for o, m in members.items() if o not in (me.node.id, bad.node.id)]
        assert att["alpha"] is not None
        assert att["alpha"] > 0
        assert att["weight"] is not None
        assert att["weight"] < att["alpha"] / 2
        assert att["update_norm"] is not None
        assert att["drift"] is not None
        assert all(m["drift"] is not None and att["drift"] > 3 * m["drift"] for m in honest)
        # ... and once the norms' median is known, its entries are refused, by reason.
        assert {"peer": bad.node.id, "reason": "update_norm_too_large", "count": 1} in [
            x for r in records for x in r["refused"]]
        last = {m["origin"]: m for m in records[-1]["members"]}
        assert last[bad.node.id]["verdict"] == "rejected"
        assert last[bad.node.id]["weight"] == 0.0
    clean_fleet, clean_good, _ = _mesh(tmp_path / "clean", honest=3, attacker=False)
    clean = _mean_accuracy_over_last(clean_fleet, clean_good)
    print(f"\nhonest mean val accuracy over rounds {ROUNDS - LAST + 1}-{ROUNDS}: attacked "
          f"{attacked:.3f}, clean {clean:.3f}")
    assert attacked >= clean - MAX_ACCURACY_LOSS
