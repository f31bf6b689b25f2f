"""Views (issue 17) in knowledge mode's gossip state: a view schema's knowledge entries travel
through real sessions (in memory) without keys entries, relay, age out, respect the sample
budget and survive a restart; FedCache nodes and view nodes ignore each other's entries."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from peerd.core.validate import ValidationLimits
from peerd.node.knowstate import KnowledgeState, sign_own_view
from peerd.protocol.kinds import KNOWLEDGE
from peerd.protocol.knowledge import KnowledgeSchema
from peerd.protocol.manifest import Manifest
from peerd.store import persist
from peerd.store.statedir import StateDir
from tests.net.test_gossip import ADMIN, session
from tests.node.fleet import FLEET, NOW, SCHEMA, key, manifest
from tests.node.test_knowstate import knode, publish_knowledge

VS = KnowledgeSchema(key_dim=4, num_classes=10, encoder="test-views", max_samples=64,
                     view_ids=1000)
A, B, C = key(11), key(12), key(13)


def vnode(k: object, *members: object, capacity: int = 5,
          budget: int | None = None) -> KnowledgeState:
    man: Manifest = manifest(*members)  # type: ignore[arg-type]
    n = KnowledgeState(key=k, fleet_id=FLEET, manifest=man, schema=SCHEMA,  # type: ignore[arg-type]
                       limits=ValidationLimits(), tau_max=600.0, capacity=capacity,
                       knowledge=VS, sample_budget=budget)
    n.manifest_envelope = man.sign(ADMIN)
    return n


def publish_view(n: KnowledgeState, version: int, ids: list[int], *,
                 at: float = NOW) -> None:
    vectors = np.full((len(ids), 4), float(version), np.float32)
    vectors[:, 0] = ids
    held = sign_own_view(n.key, FLEET, VS, version=version, created_at=at,
                         ids=np.array(ids, np.int32), vectors=vectors)
    n.set_own(held.entry, held.message)
    n.own = held


def test_views_travel_without_keys_and_the_freshest_is_read() -> None:
    a, b = vnode(A, A, B), vnode(B, A, B)
    publish_view(a, 2, [5, 7, 900])
    publish_view(b, 3, [1, 2])
    ra, rb = session(a, b)
    assert (ra.received, rb.received) == (1, 1)  # one entry each way, no keys entries
    (view,) = a.views()
    assert (view.origin, view.version, view.ids.tolist()) == (b.id, 3, [1, 2])
    np.testing.assert_array_equal(view.vectors[:, 0], [1, 2])
    assert (a.keys, a.batches()) == ({}, [])  # nothing to join: views name no keys
    publish_view(b, 4, [1, 2, 3])
    ra, _ = session(a, b)
    assert ra.received == 1
    assert [(v.version, v.ids.tolist()) for v in a.views()] == [(4, [1, 2, 3])]


def test_a_relay_hands_views_on_and_they_age_out() -> None:
    a, b, c = vnode(A, A, B, C), vnode(B, A, B, C), vnode(C, A, B, C)
    publish_view(a, 2, [3], at=NOW)
    session(a, b)
    into_c, _ = session(c, b)  # c never met a
    assert into_c.received == 1
    assert [v.origin for v in c.views()] == [a.id]
    c.expire(NOW + 601)  # τ_max
    assert c.views() == []


def test_the_sample_budget_keeps_the_freshest_views_that_fit() -> None:
    a, b, c = vnode(A, A, B, C), vnode(B, A, B, C), vnode(C, A, B, C, budget=12)
    publish_view(a, 2, list(range(8)), at=NOW - 5)
    publish_view(b, 2, list(range(8)), at=NOW)
    session(a, c)
    session(b, c)
    assert [v.origin for v in c.views()] == [b.id]


def test_view_and_fedcache_nodes_ignore_each_other() -> None:
    v, k = vnode(A, A, B), knode(B, A, B)
    publish_view(v, 3, [1])
    publish_knowledge(k, 4)
    rv, rk = session(v, k)
    assert (rv.received, rk.received) == (0, 0)
    assert (v.cache, k.cache) == ([], [])


def test_views_survive_a_restart(tmp_path: Path) -> None:
    a, b = vnode(A, A, B), vnode(B, A, B)
    publish_view(a, 2, [4, 9])
    session(a, b)
    state = StateDir(tmp_path / "b")
    persist.save_cache(state, b, set())
    fresh = vnode(B, A, B)
    restored = persist.restore(state, fresh, now=NOW)
    assert (restored.cached, restored.refused) == (1, 0)
    assert [(i.meta.kind, i.meta.origin) for i in fresh.cache] == [(KNOWLEDGE, a.id)]
    assert fresh.views()[0].ids.tolist() == [4, 9]
