"""Entries on disk are signed frames, verified again on load like entries from the network."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from peerd.node.state import NodeState, sign_own, verify
from peerd.store import persist
from peerd.store.statedir import ENTRY_BLOB_PREFIX, StateDir, StateError
from tests.node.fleet import FLEET, NOW, SCHEMA, key, manifest, model, node

A, B, OUT = key(1), key(2), key(9)
MAN = manifest(A, B)


def with_entry_from_b(a: NodeState) -> None:
    _, message = sign_own(B, FLEET, params=model(3), version=4, created_at=NOW,
                              num_examples=7)
    v = verify(message, fleet_id=FLEET, manifest=MAN, ledger=a.ledger.view(), schema=SCHEMA,
               limits=a.limits, now=NOW)
    assert a.accept(v, sender="relay-x", now=NOW + 1) is None


def test_own_entry_and_cache_survive_a_restart_with_provenance(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    a = node(A, MAN)
    held = persist.publish_own(state, a, params=model(1), version=9, created_at=NOW,
                               num_examples=5)
    a.set_own(held.entry, held.message, held.frame)
    with_entry_from_b(a)
    persist.save_cache(state, a, set())

    fresh = node(A, MAN)
    restored = persist.restore(StateDir(tmp_path / "s"), fresh, now=NOW + 2)
    assert (restored.own, restored.cached, restored.refused) == (True, 1, 0)
    assert fresh.own is not None
    assert fresh.own.entry.meta.version == 9
    item = fresh.cache[0]
    assert (item.meta.version, item.received_from, item.received_at) == (4, "relay-x", NOW + 1)
    # the ledger is rebuilt too: the same entry again is "not newer"
    assert fresh.ledger.held[item.meta.origin].version == 4


def test_a_tampered_entry_file_is_refused_and_removed_on_load(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    a = node(A, MAN)
    with_entry_from_b(a)
    persist.save_cache(state, a, set())
    name = state.list_blobs(ENTRY_BLOB_PREFIX)[0]
    data = bytearray(state.read_blob(name) or b"")
    data[-1] ^= 0xFF  # a flipped weight byte, re-wrapped in a valid state-file header
    state.write_blob(name, bytes(data))
    fresh = node(A, MAN)
    restored = persist.restore(state, fresh, now=NOW)
    assert (restored.cached, restored.refused) == (0, 1)
    assert fresh.cache == []
    assert state.list_blobs(ENTRY_BLOB_PREFIX) == []


def test_an_entry_planted_by_a_non_member_is_refused(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    _, message = sign_own(OUT, FLEET, params=model(0), version=1, created_at=NOW,
                          num_examples=1)
    state.write_blob(ENTRY_BLOB_PREFIX + "planted", message.head() + bytes(message.payload))
    restored = persist.restore(state, node(A, MAN), now=NOW)
    assert (restored.cached, restored.refused) == (0, 1)


def test_an_own_entry_signed_by_another_key_is_not_adopted(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    b = node(B, MAN)
    persist.publish_own(state, b, params=model(0), version=3, created_at=NOW, num_examples=1)
    a = node(A, MAN)
    assert persist.restore(state, a, now=NOW).own is False
    assert a.own is None


def test_the_own_entry_is_signed_into_its_file_and_mapped(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    a = node(A, MAN)
    held = persist.publish_own(state, a, params=model(2), version=3, created_at=NOW,
                               num_examples=5)
    assert held.frame is not None
    assert held.frame.committed
    assert held.frame.path == state.blob_path(persist.OWN_BLOB)
    a.set_own(held.entry, held.message, held.frame)
    for name, t in model(2).items():
        assert torch.equal(held.entry.params[name], t)
    fresh = node(A, MAN)
    assert persist.restore(StateDir(tmp_path / "s"), fresh, now=NOW).own
    assert fresh.own is not None
    assert fresh.own.entry.meta.version == 3


def test_publishing_on_a_full_disk_keeps_the_entry_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = StateDir(tmp_path / "s")

    def full(*_: object, **__: object) -> None:
        raise StateError(errno.ENOSPC, "cannot write: No space left on device (disk full)")

    monkeypatch.setattr(state, "write_blob", full)
    a, b = node(A, MAN), node(B, MAN)
    held = persist.publish_own(state, a, params=model(2), version=3, created_at=NOW,
                               num_examples=5)
    assert held.frame is None  # in memory, still a valid signed entry
    v = verify(held.message, fleet_id=FLEET, manifest=MAN, ledger=b.ledger.view(), schema=SCHEMA,
               limits=b.limits, now=NOW)
    assert v.entry.meta.version == 3
