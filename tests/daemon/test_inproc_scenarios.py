"""Issue 5's scenarios 4 (capacity) and 9 (learning) on real ``Daemon`` objects in one
process (tests/daemon/inprocfleet.py): what they check is the cache's and the blend's, not
the network's. Their real-process forms are in tests/integration/test_scenarios.py, marked
``long``; discovery, relays, partitions, hostile peers and kill -9 stay there on real
daemons."""

from __future__ import annotations

from pathlib import Path

from peerd.daemon.config_learning import LearningConfig
from peerd.daemon.daemon import Daemon
from tests.daemon.inprocfleet import Fleet, fleet_configs, with_learning

#: As the integration scenarios: these test gossip, not learning.
LIGHT = {"local_steps": 3}


def _origins(fleet: Fleet, i: int) -> set[str]:
    return {c.meta.origin for c in fleet[i].node.cache}


# ---------------------------------------------------------------------------- 4 capacity
def test_4_capacity_two_keeps_only_the_two_freshest_entries(tmp_path: Path) -> None:
    # Six daemons, C = 2. Three publish every round ("fresh"); three publish once and then
    # never again (ε so large that no drift exceeds it: "frozen"). Every node sees all five
    # others' entries, so once the fresh ones have published past the frozen ones, each cache
    # must hold exactly the freshest two: fresh origins only.
    cfgs = fleet_configs(tmp_path, 6, learning={**LIGHT, "capacity": 2,
                                                "round_interval_s": 2.0, "tau_max": 120.0})
    fleet = Fleet([*cfgs[:3], *(with_learning(c, epsilon=1e9) for c in cfgs[3:])])
    fresh_ids = {d.node.id for d in fleet.daemons[:3]}
    largest = 0

    def settled() -> bool:
        return all(len(_origins(fleet, i)) == 2 and _origins(fleet, i) <= fresh_ids - {d.node.id}
                   for i, d in enumerate(fleet.daemons))

    cycles = 0
    while cycles < 10 and not settled():
        cycles += 1
        fleet.cycle()
        largest = max(largest, *(len(d.node.cache) for d in fleet.daemons))
    assert settled(), [sorted(_origins(fleet, i)) for i in range(6)]
    # It stays that way while everyone keeps gossiping (never above C, never a frozen entry).
    for _ in range(4):
        fleet.cycle()
        largest = max(largest, *(len(d.node.cache) for d in fleet.daemons))
        for i, d in enumerate(fleet.daemons):
            assert _origins(fleet, i) <= fresh_ids - {d.node.id}, (i, _origins(fleet, i))
    assert largest <= 2
    for d in fleet.daemons[3:]:
        s = d.status()
        assert s.node.version == 1  # trained, published once
        assert s.node.round > 3
    # The frozen entries were offered to everyone and lost on freshness, not on validity.
    for d in fleet.daemons:
        assert d.status().rejected == {}
    print(f"\nscenario 4 in-process: settled after {cycles} rounds")


# ---------------------------------------------------------------------------- 9 learning
LEARNING_ROUNDS = 20


def test_9_mesh_learns_better_than_the_same_hosts_alone_on_non_iid_digits(
    tmp_path: Path
) -> None:
    # The same four non-IID slices twice (same seed, same node_index): once as a mesh, once
    # as four isolated daemons (a fleet of their own whose members never meet). The
    # daemon's default K, as `peerd run` trains.
    learning = {"local_steps": LearningConfig().local_steps, "round_interval_s": 1.0,
                "tau_max": 120.0}
    task = {"name": "digits", "partition": "shards", "seed": 0}
    mesh = Fleet(fleet_configs(tmp_path / "mesh", 4, learning=learning, task=task))
    alone = Fleet(fleet_configs(tmp_path / "alone", 4, learning=learning, task=task))
    for _ in range(LEARNING_ROUNDS):
        mesh.cycle()
        alone.round()
    mesh_acc = [_val_accuracy(d) for d in mesh.daemons]
    alone_acc = [_val_accuracy(d) for d in alone.daemons]
    mean_mesh, mean_alone = sum(mesh_acc) / 4, sum(alone_acc) / 4
    print(f"\nscenario 9 in-process: digits, shards partition, 4 nodes, {LEARNING_ROUNDS} "
          f"rounds:\n"
          f"  mesh     {' '.join(f'{a:.3f}' for a in mesh_acc)}  mean {mean_mesh:.3f}\n"
          f"  isolated {' '.join(f'{a:.3f}' for a in alone_acc)}  mean {mean_alone:.3f}")
    # The mesh actually gossiped, the isolated ones never did.
    for d in mesh.daemons:
        s = d.status()
        assert s.node.round == LEARNING_ROUNDS
        assert len(s.cache) == 3
    for d in alone.daemons:
        s = d.status()
        assert s.node.round == LEARNING_ROUNDS
        assert s.cache == ()
        assert s.peers == ()
    assert mean_mesh > mean_alone + 0.1


def _val_accuracy(d: Daemon) -> float:
    acc = d.status().node.val_accuracy
    assert acc is not None
    return acc
