"""FedCache over the mobility model's contacts: a client learns only from the knowledge it
was handed (directly or relayed), under the cache's C and τ_max, and traffic is what moved."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from peerd.sim.algorithms import origin_id
from peerd.sim.knowledge import KnowledgeSimConfig, run_knowledge
from peerd.sim.knowledge_data import make_setup
from peerd.sim.knowledge_fedcache import KnowledgeFleet, OverContacts

CONFIG = KnowledgeSimConfig(dataset="digits", agents=4, rounds=3, models="large", lr=0.05,
                            batch_size=8, r=4, key_dim=16, algorithms=("fedcache-mobility",))


def _exchange(config: KnowledgeSimConfig, meetings: list[list[tuple[int, int]]]
              ) -> tuple[OverContacts, KnowledgeFleet]:
    fleet = KnowledgeFleet.build(config, make_setup(config))
    ex = OverContacts(fleet)
    script = iter(meetings)
    # One tick per round, with the pairs the test says met (instead of the mobility model).
    ex.next_round = lambda: [np.array(next(script), dtype=np.int64).reshape(-1, 2)]
    return ex, fleet


def _publish(ex: OverContacts, fleet: KnowledgeFleet, t: int) -> None:
    # Client a's logits are all a + 1 (so a teacher's value names its origins).
    ex.publish(t, [(a, np.full((len(p), 10), a + 1, np.float16))
                   for a, p in enumerate(fleet.setup.train)])


def _taught(ex: OverContacts, fleet: KnowledgeFleet, t: int, a: int) -> set[float]:
    teacher, has = ex.teachers(t) or (None, None)
    assert teacher is not None
    assert has is not None
    rows = torch.from_numpy(fleet.setup.train[a])
    return set(teacher[rows][has[rows]].flatten().tolist())


def test_round_1_is_eq9_zeros_and_a_client_that_met_no_one_trains_ce_only() -> None:
    ex, fleet = _exchange(CONFIG, [[(0, 1)]])
    teacher, has = ex.teachers(0) or (None, None)
    assert has is not None
    assert teacher is not None
    assert bool(has.all())
    assert float(teacher.abs().max()) == 0.0
    _publish(ex, fleet, 0)
    assert _taught(ex, fleet, 1, 0) == {2.0}  # only client 1's knowledge
    assert _taught(ex, fleet, 1, 1) == {1.0}  # only client 0's
    assert _taught(ex, fleet, 1, 2) == set() == _taught(ex, fleet, 1, 3)


def test_knowledge_is_relayed_and_traffic_is_logits_per_entry_keys_once() -> None:
    ex, fleet = _exchange(CONFIG, [[(0, 1)], [(1, 2)], [(1, 2)]])
    _publish(ex, fleet, 0)
    assert ex.traffic()["entries_moved"] == 2
    first = sum(fleet.logit_bytes(a) + fleet.key_bytes(a) for a in (0, 1))
    assert ex.traffic()["exchanged"] == first
    _publish(ex, fleet, 1)
    # 2 gets 1's entry and, relayed, 0's; 1 gets 2's. Each for the first time: keys too.
    moved = {(a, o) for a, o in [(2, 1), (2, 0), (1, 2)]}
    assert ex.traffic()["entries_moved"] == 2 + len(moved)
    second = sum(fleet.logit_bytes(o) + fleet.key_bytes(o) for _, o in moved)
    assert ex.traffic()["exchanged"] == first + second
    assert set(ex.local[2].origins()) == {origin_id(0), origin_id(1)}
    taught = _taught(ex, fleet, 2, 2)  # means over R neighbours of 0's (1) and 1's (2)
    assert taught
    assert all(1.0 <= v <= 2.0 for v in taught)
    _publish(ex, fleet, 2)
    # The same pair again: newer versions of 1's and 2's own entries move, keys do not.
    # (0's version 1 is not newer than what 2 holds, so nothing of 0's moves.)
    third = fleet.logit_bytes(1) + fleet.logit_bytes(2)
    assert ex.traffic()["exchanged"] == first + second + third


def test_the_cache_keeps_c_entries_and_forgets_knowledge_older_than_tau_max() -> None:
    ex, fleet = _exchange(replace(CONFIG, capacity=1, tau_max=1.0), [[(0, 1), (0, 2)], [], []])
    _publish(ex, fleet, 0)
    assert max(len(c.origins()) for c in ex.local) == 1  # 0 met two, keeps C = 1 of them
    assert len(_taught(ex, fleet, 1, 0)) == 1
    _publish(ex, fleet, 1)
    _publish(ex, fleet, 2)  # nobody met since round 1: its entries are now 2 rounds old
    assert all(not c.origins() for c in ex.local)
    assert _taught(ex, fleet, 3, 0) == set()


@pytest.fixture(scope="module")
def mobility_run() -> dict[str, Any]:
    return run_knowledge(replace(CONFIG, agents=6, rounds=3,
                                 algorithms=("fedcache", "fedcache-mobility"))).summary()


def test_a_mobility_run_reports_its_traffic_and_bounded_caches(
        mobility_run: dict[str, Any]) -> None:
    info = mobility_run["info"]["fedcache-mobility"]
    assert 0 <= info["knowledge_entries_held_mean"] <= CONFIG.capacity
    traffic = mobility_run["traffic_bytes"]["fedcache-mobility"]
    curve = mobility_run["curves"]["fedcache-mobility"]
    assert curve[-1][3] == traffic["exchanged"]
    assert [r[3] for r in curve] == sorted(r[3] for r in curve)  # cumulative
    # Without a server every byte is a peer's: no more than all-to-all gossip would move.
    assert traffic["exchanged"] <= mobility_run["traffic_bytes"]["fedcache"]["gossip_all_to_all"]
