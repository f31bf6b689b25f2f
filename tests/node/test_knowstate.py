"""Knowledge mode's gossip state: knowledge and keys entries through real sessions (in
memory), the keys-by-reference rule, relays, the sample budget and kinds that do not mix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from peerd.core.reasons import Reason
from peerd.core.validate import ValidationLimits
from peerd.node.knowstate import KnowledgeState, sign_own_keys, sign_own_knowledge
from peerd.node.state import NodeState
from peerd.protocol.kinds import KEYS, KNOWLEDGE
from peerd.protocol.knowledge import KnowledgeSchema
from peerd.protocol.manifest import Manifest
from peerd.store import persist
from peerd.store.statedir import StateDir
from tests.net.test_gossip import ADMIN, publish, session, signed_node
from tests.node.fleet import FLEET, NOW, SCHEMA, key, manifest

KS = KnowledgeSchema(key_dim=4, num_classes=3, encoder="test", max_samples=64)
A, B, C = key(11), key(12), key(13)


def unit(n: int, seed: int) -> npt.NDArray[np.float32]:
    x = np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32)
    out: npt.NDArray[np.float32] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def knode(k: object, *members: object, capacity: int = 5,
          budget: int | None = None) -> KnowledgeState:
    man: Manifest = manifest(*members)  # type: ignore[arg-type]
    n = KnowledgeState(key=k, fleet_id=FLEET, manifest=man, schema=SCHEMA,  # type: ignore[arg-type]
                       limits=ValidationLimits(), tau_max=600.0, capacity=capacity,
                       knowledge=KS, sample_budget=budget)
    n.manifest_envelope = man.sign(ADMIN)
    return n


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


def held_kinds(n: KnowledgeState) -> list[tuple[str, str, int]]:
    return sorted((h.entry.meta.kind, h.entry.meta.origin[-4:], h.entry.meta.version)
                  for h in n.holdings() if h is not n.own and h is not n.own_keys)


def test_knowledge_and_its_keys_travel_and_join() -> None:
    a, b = knode(A, A, B), knode(B, A, B)
    publish_knowledge(a, 2, rows=5, seed=1)
    publish_knowledge(b, 8, rows=7, seed=2)
    ra, rb = session(a, b)
    assert (ra.received, rb.received) == (2, 2)  # a knowledge entry and its keys each way
    assert [(i.meta.kind, i.meta.origin, i.meta.version) for i in a.cache] == [
        (KNOWLEDGE, b.id, 8)]
    assert a.keys[b.id].entry.meta.kind == KEYS
    (rows,) = a.batches()
    assert (rows.origin, rows.version, rows.keys.shape, rows.logits.shape) == (b.id, 8, (7, 4),
                                                                             (7, 3))
    assert rows.labels.tolist() == [0, 1, 2, 0, 1, 2, 0]
    np.testing.assert_allclose(rows.keys, unit(7, 2), atol=2e-3)
    # A second session moves nothing; the next round's knowledge travels without its keys.
    ra, rb = session(a, b)
    assert (ra.received, rb.received) == (0, 0)
    publish_knowledge(b, 9, rows=7, seed=2)
    ra, rb = session(a, b)
    assert (ra.received, rb.received) == (1, 0)
    assert a.batches()[0].version == 9
    assert a.keys[b.id].entry.meta.version == 7  # the same keys entry, still named


def test_a_relay_hands_on_knowledge_with_its_keys() -> None:
    a, b, c = knode(A, A, B, C), knode(B, A, B, C), knode(C, A, B, C)
    publish_knowledge(a, 3)
    session(a, b)
    into_c, _ = session(c, b)  # c has never met a
    assert into_c.received == 2
    assert [r.origin for r in c.batches()] == [a.id]


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


def test_keys_go_when_their_knowledge_expires() -> None:
    a, b = knode(A, A, B), knode(B, A, B)
    publish_knowledge(a, 2, at=NOW)
    session(a, b)
    assert a.id in b.keys
    b.expire(NOW + 601)
    assert (b.cache, b.keys) == ([], {})


def test_knowledge_waiting_for_its_keys_is_not_joined() -> None:
    a, b = knode(A, A, B), knode(B, A, B)
    publish_knowledge(a, 2)
    assert isinstance(a.own, type(a.own_keys))
    assert b.accept(a.own, sender=a.id, now=NOW) is None  # type: ignore[arg-type]
    assert b.batches() == []  # keys not here yet: next round
    assert b.wants(a.digest(), NOW).items == ((a.id, 1),)  # asks for exactly those keys


def test_capacity_in_samples_keeps_the_freshest_that_fit() -> None:
    a, b, c = knode(A, A, B, C), knode(B, A, B, C), knode(C, A, B, C, budget=12)
    publish_knowledge(a, 2, rows=8, at=NOW - 5)
    publish_knowledge(b, 2, rows=8, at=NOW)
    session(a, c)
    session(b, c)
    assert [i.meta.origin for i in c.cache] == [b.id]  # 8 + 8 > 12: the fresher one stays
    assert c.dropped[str(Reason.EVICTED)] == 1
    assert list(c.keys) == [b.id]


def test_weight_and_knowledge_nodes_ignore_each_others_entries() -> None:
    w: NodeState = signed_node(A, 1, A, B)
    k = knode(B, A, B)
    publish(w, 3)
    publish_knowledge(k, 4)
    rw, rk = session(w, k)
    assert (rw.received, rk.received) == (0, 0)  # neither wants what it cannot use
    assert (w.cache, k.cache) == ([], [])


def test_knowledge_survives_a_restart_and_its_keys_are_asked_for_again(tmp_path: Path) -> None:
    a, b = knode(A, A, B), knode(B, A, B)
    publish_knowledge(a, 2)
    session(a, b)
    state = StateDir(tmp_path / "b")
    persist.save_cache(state, b, set())
    fresh = knode(B, A, B)
    restored = persist.restore(state, fresh, now=NOW)
    assert (restored.cached, restored.refused) == (1, 0)
    assert [(i.meta.kind, i.meta.origin) for i in fresh.cache] == [(KNOWLEDGE, a.id)]
    assert fresh.keys == {}  # not persisted: fetched again, by the digest its entry names
    assert fresh.wants(a.digest(), NOW).items == ((a.id, 1),)
    # A weight node refuses the knowledge node's files (and deletes them).
    weights = signed_node(B, 1, A, B)
    assert persist.restore(state, weights, now=NOW).refused == 1
    assert weights.cache == []


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
