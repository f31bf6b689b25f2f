"""Knowledge mode's gossip state, for both layouts a ``KnowledgeState`` holds: FedCache
(knowledge entries that name a keys entry) and views (issue 17: knowledge entries under a view
schema, no keys). Through real sessions (in memory), both layouts travel, relay, age out,
respect the sample budget, survive a restart and ignore entries of another kind; then what
only FedCache has (the keys-by-reference rule) and what only views have."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from peerd.core.reasons import Reason
from peerd.core.validate import ValidationLimits
from peerd.node.knowstate import (
    KnowledgeState,
    sign_own_keys,
    sign_own_knowledge,
    sign_own_view,
)
from peerd.node.state import NodeState
from peerd.protocol.kinds import KEYS, KNOWLEDGE
from peerd.protocol.knowledge import KnowledgeSchema
from peerd.protocol.manifest import Manifest
from peerd.store import persist
from peerd.store.statedir import StateDir
from tests.net.test_gossip import ADMIN, publish, session, signed_node
from tests.node.fleet import FLEET, NOW, SCHEMA, key, manifest

KS = KnowledgeSchema(key_dim=4, num_classes=3, encoder="test", max_samples=64)
VS = KnowledgeSchema(key_dim=4, num_classes=10, encoder="test-views", max_samples=64,
                     view_ids=1000)
A, B, C = key(11), key(12), key(13)


def unit(n: int, seed: int) -> npt.NDArray[np.float32]:
    x = np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32)
    out: npt.NDArray[np.float32] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def _node(schema: KnowledgeSchema, k: object, members: tuple[object, ...], capacity: int,
          budget: int | None) -> KnowledgeState:
    man: Manifest = manifest(*members)  # type: ignore[arg-type]
    n = KnowledgeState(key=k, fleet_id=FLEET, manifest=man, schema=SCHEMA,  # type: ignore[arg-type]
                       limits=ValidationLimits(), tau_max=600.0, capacity=capacity,
                       knowledge=schema, sample_budget=budget)
    n.manifest_envelope = man.sign(ADMIN)
    return n


def knode(k: object, *members: object, capacity: int = 5,
          budget: int | None = None) -> KnowledgeState:
    return _node(KS, k, members, capacity, budget)


def vnode(k: object, *members: object, capacity: int = 5,
          budget: int | None = None) -> KnowledgeState:
    return _node(VS, k, members, capacity, budget)


def publish_knowledge(n: KnowledgeState, version: int, rows: int = 5, *, seed: int = 0,
                      at: float = NOW, keys_version: int | None = None) -> None:
    if n.own_keys is None or keys_version is not None:
        n.set_own_keys(sign_own_keys(n.key, FLEET, KS, version=keys_version or version - 1,
                                     created_at=at - 1, keys=unit(rows, seed),
                                     labels=np.arange(rows) % 3))
    assert n.own_keys is not None
    held = sign_own_knowledge(n.key, FLEET, KS, version=version, created_at=at,
                              ids=np.arange(rows, dtype=np.int32),
                              logits=np.full((rows, 3), float(version), np.float32),
                              keys_digest=n.own_keys.entry.meta.digest)
    n.set_own(held.entry, held.message)
    n.own = held


def publish_view(n: KnowledgeState, version: int, ids: list[int], *,
                 at: float = NOW) -> None:
    vectors = np.full((len(ids), 4), float(version), np.float32)
    vectors[:, 0] = ids
    held = sign_own_view(n.key, FLEET, VS, version=version, created_at=at,
                         ids=np.array(ids, np.int32), vectors=vectors)
    n.set_own(held.entry, held.message)
    n.own = held


# ---------------------------------------------------------------------------- both layouts


@dataclass(frozen=True)
class Layout:
    name: str
    node: Callable[..., KnowledgeState]
    #: Entries one origin's first publication puts on the wire (knowledge + keys, or a view).
    first: int

    def publish(self, n: KnowledgeState, version: int, rows: int = 5, *,
                at: float = NOW) -> None:
        if self.node is knode:
            publish_knowledge(n, version, rows, at=at)
        else:
            publish_view(n, version, list(range(rows)), at=at)

    def read(self, n: KnowledgeState) -> list[tuple[str, int, int]]:
        """What the round reads of ``n``'s cache: (origin, version, rows) per peer."""
        if self.node is knode:
            return [(r.origin, r.version, len(r.logits)) for r in n.batches()]
        return [(v.origin, v.version, len(v.ids)) for v in n.views()]


FEDCACHE_LAYOUT = Layout("fedcache", knode, 2)
VIEW_LAYOUT = Layout("views", vnode, 1)
LAYOUTS = [pytest.param(FEDCACHE_LAYOUT, id="fedcache"), pytest.param(VIEW_LAYOUT, id="views")]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_entries_travel_once_and_the_freshest_is_read(layout: Layout) -> None:
    a, b = layout.node(A, A, B), layout.node(B, A, B)
    layout.publish(a, 2, rows=5)
    layout.publish(b, 8, rows=7)
    ra, rb = session(a, b)
    assert (ra.received, rb.received) == (layout.first, layout.first)
    assert [(i.meta.kind, i.meta.origin, i.meta.version) for i in a.cache] == [
        (KNOWLEDGE, b.id, 8)]
    assert layout.read(a) == [(b.id, 8, 7)]
    # A second session moves nothing; the next round's entry travels alone.
    ra, rb = session(a, b)
    assert (ra.received, rb.received) == (0, 0)
    layout.publish(b, 9, rows=7)
    ra, rb = session(a, b)
    assert (ra.received, rb.received) == (1, 0)
    assert layout.read(a) == [(b.id, 9, 7)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_relay_hands_entries_on_and_they_age_out(layout: Layout) -> None:
    a, b, c = layout.node(A, A, B, C), layout.node(B, A, B, C), layout.node(C, A, B, C)
    layout.publish(a, 3, at=NOW)
    session(a, b)
    into_c, _ = session(c, b)  # c has never met a
    assert into_c.received == layout.first
    assert [r[0] for r in layout.read(c)] == [a.id]
    c.expire(NOW + 601)  # τ_max
    assert (c.cache, c.keys, layout.read(c)) == ([], {}, [])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_sample_budget_keeps_the_freshest_that_fit(layout: Layout) -> None:
    a, b = layout.node(A, A, B, C), layout.node(B, A, B, C)
    c = layout.node(C, A, B, C, budget=12)
    layout.publish(a, 2, rows=8, at=NOW - 5)
    layout.publish(b, 2, rows=8, at=NOW)
    session(a, c)
    session(b, c)
    assert [i.meta.origin for i in c.cache] == [b.id]  # 8 + 8 > 12: the fresher one stays
    assert [r[0] for r in layout.read(c)] == [b.id]
    assert c.dropped[str(Reason.EVICTED)] == 1


def _weights(k: object, *members: object) -> NodeState:
    return signed_node(k, 1, *members)


def _publish_weights(n: NodeState, version: int) -> None:
    publish(n, version)


@pytest.mark.parametrize(("ours", "theirs"), [
    pytest.param(FEDCACHE_LAYOUT, None, id="fedcache-weights"),
    pytest.param(VIEW_LAYOUT, FEDCACHE_LAYOUT, id="views-fedcache"),
    pytest.param(VIEW_LAYOUT, None, id="views-weights"),
])
def test_nodes_of_other_kinds_ignore_each_others_entries(ours: Layout,
                                                         theirs: Layout | None) -> None:
    mine = ours.node(A, A, B)
    other: NodeState = theirs.node(B, A, B) if theirs else _weights(B, A, B)
    ours.publish(mine, 3)
    if theirs is None:
        _publish_weights(other, 4)
    else:
        theirs.publish(other, 4)  # type: ignore[arg-type]
    rm, ro = session(mine, other)
    assert (rm.received, ro.received) == (0, 0)  # neither wants what it cannot use
    assert (mine.cache, other.cache) == ([], [])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_entries_survive_a_restart_and_a_weight_node_refuses_them(tmp_path: Path,
                                                                  layout: Layout) -> None:
    a, b = layout.node(A, A, B), layout.node(B, A, B)
    layout.publish(a, 2)
    session(a, b)
    state = StateDir(tmp_path / "b")
    persist.save_cache(state, b, set())
    fresh = layout.node(B, A, B)
    restored = persist.restore(state, fresh, now=NOW)
    assert (restored.cached, restored.refused) == (1, 0)
    assert [(i.meta.kind, i.meta.origin) for i in fresh.cache] == [(KNOWLEDGE, a.id)]
    # A weight node refuses the files (and deletes them).
    weights = _weights(B, A, B)
    assert persist.restore(state, weights, now=NOW).refused == 1
    assert weights.cache == []


# ---------------------------------------------------------------------------- FedCache only


def test_knowledge_is_joined_with_its_keys() -> None:
    a, b = knode(A, A, B), knode(B, A, B)
    publish_knowledge(a, 2, rows=5, seed=1)
    publish_knowledge(b, 8, rows=7, seed=2)
    session(a, b)
    assert a.keys[b.id].entry.meta.kind == KEYS
    (rows,) = a.batches()
    assert (rows.keys.shape, rows.logits.shape) == ((7, 4), (7, 3))
    assert rows.labels.tolist() == [0, 1, 2, 0, 1, 2, 0]
    np.testing.assert_allclose(rows.keys, unit(7, 2), atol=2e-3)
    publish_knowledge(b, 9, rows=7, seed=2)
    session(a, b)
    assert a.keys[b.id].entry.meta.version == 7  # the same keys entry, still named


def test_changed_keys_replace_the_old_ones() -> None:
    a, b = knode(A, A, B), knode(B, A, B)
    publish_knowledge(a, 2, seed=1)
    session(a, b)
    old = b.keys[a.id].entry.meta.digest
    publish_knowledge(a, 4, seed=5, keys_version=3)  # new samples: a new keys entry
    _, into_b = session(a, b)
    assert into_b.received == 2
    assert b.keys[a.id].entry.meta.digest != old
    assert b.keys[a.id].entry.meta.version == 3
    np.testing.assert_allclose(b.batches()[0].keys, unit(5, 5), atol=2e-3)


def test_keys_nobody_names_are_dropped() -> None:
    a, b = knode(A, A, B), knode(B, A, B)
    publish_knowledge(a, 2)
    assert a.own_keys is not None
    assert b.accept(a.own_keys, sender=a.id, now=NOW) is Reason.UNREFERENCED
    assert b.keys == {}
    assert b.dropped[str(Reason.UNREFERENCED)] == 1


def test_keys_go_with_their_evicted_knowledge() -> None:
    # (Expiry takes them too: test_a_relay_hands_entries_on_and_they_age_out.)
    a, b, c = knode(A, A, B, C), knode(B, A, B, C), knode(C, A, B, C, budget=12)
    publish_knowledge(a, 2, rows=8, at=NOW - 5)
    publish_knowledge(b, 2, rows=8, at=NOW)
    session(a, c)
    session(b, c)
    assert list(c.keys) == [b.id]


def test_knowledge_waiting_for_its_keys_is_not_joined() -> None:
    a, b = knode(A, A, B), knode(B, A, B)
    publish_knowledge(a, 2)
    assert isinstance(a.own, type(a.own_keys))
    assert b.accept(a.own, sender=a.id, now=NOW) is None  # type: ignore[arg-type]
    assert b.batches() == []  # keys not here yet: next round
    assert b.wants(a.digest(), NOW).items == ((a.id, 1),)  # asks for exactly those keys


def test_restored_knowledge_asks_for_its_keys_again(tmp_path: Path) -> None:
    a, b = knode(A, A, B), knode(B, A, B)
    publish_knowledge(a, 2)
    session(a, b)
    state = StateDir(tmp_path / "b")
    persist.save_cache(state, b, set())
    fresh = knode(B, A, B)
    persist.restore(state, fresh, now=NOW)
    assert fresh.keys == {}  # not persisted: fetched again, by the digest its entry names
    assert fresh.batches() == []
    assert fresh.wants(a.digest(), NOW).items == ((a.id, 1),)


def test_knowledge_naming_rows_its_keys_lack_is_dropped() -> None:
    a, b = knode(A, A, B), knode(B, A, B)
    publish_knowledge(a, 2, rows=5)
    session(a, b)
    # a signs knowledge for 6 rows against its 5-row keys entry (a bug, or hostile)
    assert a.own_keys is not None
    bad = sign_own_knowledge(a.key, FLEET, KS, version=3, created_at=NOW,
                             ids=np.arange(6, dtype=np.int32),
                             logits=np.zeros((6, 3), np.float32),
                             keys_digest=a.own_keys.entry.meta.digest)
    assert b.accept(bad, sender=a.id, now=NOW) is None
    assert b.batches() == []
    assert (b.cache, b.keys) == ([], {})
    assert b.rejected[str(Reason.PAYLOAD_MISMATCH)] == 1


# ---------------------------------------------------------------------------- views only


def test_views_name_no_keys_and_carry_their_ids_and_vectors(tmp_path: Path) -> None:
    a, b = vnode(A, A, B), vnode(B, A, B)
    publish_view(a, 2, [5, 7, 900])
    publish_view(b, 3, [1, 2])
    session(a, b)
    (view,) = a.views()
    assert view.ids.tolist() == [1, 2]
    np.testing.assert_array_equal(view.vectors[:, 0], [1, 2])
    assert (a.keys, a.batches()) == ({}, [])  # nothing to join: views name no keys
    state = StateDir(tmp_path / "a")
    persist.save_cache(state, a, set())
    fresh = vnode(A, A, B)
    persist.restore(state, fresh, now=NOW)
    assert fresh.views()[0].ids.tolist() == [1, 2]  # read at once: no keys to wait for
