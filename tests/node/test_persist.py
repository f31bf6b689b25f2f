"""Entries on disk are signed frames, verified again on load like entries from the network."""

from __future__ import annotations

from pathlib import Path

from peerd import persist
from peerd.node import NodeState, sign_own, verify
from peerd.state import StateDir
from tests.node.fleet import FLEET, NOW, SCHEMA, key, manifest, model, node

A, B, OUT = key(1), key(2), key(9)
MAN = manifest(A, B)


def with_entry_from_b(a: NodeState) -> None:
    _, message = sign_own(B, FLEET, params=model(3), version=4, created_at=NOW,
                              num_examples=7)
    v = verify(message, fleet_id=FLEET, manifest=MAN, ledger=a.ledger, schema=SCHEMA,
               limits=a.limits, now=NOW)
    assert a.accept(v, sender="relay-x", now=NOW + 1) is None


def test_own_entry_and_cache_survive_a_restart_with_provenance(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    a = node(A, MAN)
    entry, message = sign_own(A, FLEET, params=model(1), version=9, created_at=NOW,
                              num_examples=5)
    a.set_own(entry, message)
    with_entry_from_b(a)
    persist.save_own(state, a)
    persist.save_cache(state, a, set())

    fresh = node(A, MAN)
    restored = persist.restore(StateDir(tmp_path / "s"), fresh, now=NOW + 2)
    assert (restored.own, restored.cached, restored.refused) == (True, 1, 0)
    assert fresh.own is not None and fresh.own.entry.meta.version == 9
    item = fresh.cache[0]
    assert (item.meta.version, item.received_from, item.received_at) == (4, "relay-x", NOW + 1)
    # the ledger is rebuilt too: the same entry again is "not newer"
    assert fresh.ledger.held[item.meta.origin].version == 4


def test_a_tampered_entry_file_is_refused_and_removed_on_load(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    a = node(A, MAN)
    with_entry_from_b(a)
    persist.save_cache(state, a, set())
    name = state.list_blobs(persist.ENTRY_PREFIX)[0]
    data = bytearray(state.read_blob(name) or b"")
    data[-1] ^= 0xFF  # a flipped weight byte, re-wrapped in a valid state-file header
    state.write_blob(name, bytes(data))
    fresh = node(A, MAN)
    restored = persist.restore(state, fresh, now=NOW)
    assert (restored.cached, restored.refused) == (0, 1)
    assert fresh.cache == [] and state.list_blobs(persist.ENTRY_PREFIX) == []


def test_an_entry_planted_by_a_non_member_is_refused(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    _, message = sign_own(OUT, FLEET, params=model(0), version=1, created_at=NOW,
                          num_examples=1)
    state.write_blob(persist.ENTRY_PREFIX + "planted", message.head() + bytes(message.payload))
    restored = persist.restore(state, node(A, MAN), now=NOW)
    assert (restored.cached, restored.refused) == (0, 1)


def test_an_own_entry_signed_by_another_key_is_not_adopted(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    b = node(B, MAN)
    entry, message = sign_own(B, FLEET, params=model(0), version=3, created_at=NOW,
                              num_examples=1)
    b.set_own(entry, message)
    persist.save_own(state, b)
    a = node(A, MAN)
    assert persist.restore(state, a, now=NOW).own is False
    assert a.own is None
