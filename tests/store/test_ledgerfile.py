"""Issue 12 item 13: the origin ledger (version high-water marks, equivocation flags) is
persisted in the state directory and survives a restart."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import MappingProxyType

import pytest

from peerd.core.reasons import Reason
from peerd.node.state import NodeState, sign_own, verify
from peerd.protocol import messages as msg
from peerd.protocol.errors import ProtocolError
from peerd.protocol.ledger import EquivocationError, Held, LedgerView
from peerd.store import ledgerfile, persist
from peerd.store.statedir import StateDir
from tests.node.fleet import FLEET, NOW, SCHEMA, key, manifest, model, node

A, B, C = key(1), key(2), key(3)
MAN = manifest(A, B, C)
DIGEST = "ab" * 32


def signed(k: object, version: int, at: float, seed: int = 0) -> msg.Entry:
    _, message = sign_own(k, FLEET, params=model(seed), version=version,  # type: ignore[arg-type]
                          created_at=at, num_examples=5)
    return message


def offer(n: NodeState, message: msg.Entry, now: float) -> Reason | None:
    """One entry as a session delivers it: verified on a snapshot, accepted on the loop."""
    try:
        v = verify(message, fleet_id=FLEET, manifest=n.manifest, ledger=n.ledger.view(),
                   schema=SCHEMA, limits=n.limits, now=now)
    except ProtocolError as exc:
        if isinstance(exc, EquivocationError):  # as peerd.net.gossip does, on its loop
            n.ledger.flag(exc.origin)
        n.reject(exc.reason)
        return exc.reason
    return n.accept(v, sender="relay", now=now)


def restart(state: StateDir, k: object, now: float, *, capacity: int = 5) -> NodeState:
    """What the daemon does at start (Daemon._restore): entries first, then the ledger."""
    n = node(k, MAN, capacity=capacity)  # type: ignore[arg-type]
    persist.restore(state, n, now=now)
    stored = ledgerfile.load(state)
    if stored is not None:
        n.restore_ledger(stored)
    return n


def save(state: StateDir, n: NodeState) -> None:
    """What the daemon does after a session: the cache, then the ledger."""
    persist.save_cache(state, n, set())
    ledgerfile.save(state, n.ledger.view())


def test_a_flag_survives_a_restart(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    b = node(B, MAN)
    assert offer(b, signed(A, 5, NOW), NOW) is None
    assert offer(b, signed(A, 5, NOW, seed=1), NOW) is Reason.EQUIVOCATION
    a_id = node(A, MAN).id
    assert b.ledger.flagged == {a_id}
    save(state, b)
    again = restart(state, B, NOW + 10)
    assert again.ledger.flagged == {a_id}
    # Before, the flag was forgotten: A's next entry was accepted as if nothing happened.
    assert offer(again, signed(A, 6, NOW + 10, seed=2), NOW + 10) is Reason.EQUIVOCATION
    assert again.ledger.clear_flag(a_id)
    assert offer(again, signed(A, 6, NOW + 10, seed=2), NOW + 10) is None


def test_an_older_but_fresh_version_of_an_evicted_origin_is_refused_after_a_restart(
    tmp_path: Path,
) -> None:
    state = StateDir(tmp_path / "s")
    b = node(B, MAN, capacity=1)
    assert offer(b, signed(A, 5, NOW - 10), NOW) is None
    assert offer(b, signed(C, 1, NOW), NOW) is None  # fresher: A@5 is evicted (C = 1)
    assert [i.meta.version for i in b.cache] == [1]
    save(state, b)
    # Restarted with room for A again: the cache alone does not know A@5 was accepted.
    again = restart(state, B, NOW + 1, capacity=2)
    a_id = node(A, MAN).id
    assert again.ledger.held[a_id].version == 5
    # A relay offers A's older version 4, still fresh: not even asked for, refused if pushed
    # (before, the rebuilt ledger knew nothing of A and it was cached).
    offered = msg.Digest((msg.DigestItem(a_id, 4, NOW - 20, bytes.fromhex(DIGEST)),))
    assert again.wants(offered, NOW + 1).items == ()
    assert offer(again, signed(A, 4, NOW - 20, seed=3), NOW + 1) is Reason.NOT_NEWER
    assert again.cache[0].meta.version == 1


def test_the_highest_own_version_seen_survives_a_restart(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    a = node(A, MAN)
    a.ledger.record(a.id, 41, DIGEST, NOW)  # as when a peer handed our own v41 back
    ledgerfile.save(state, a.ledger.view())
    again = restart(state, A, NOW)
    assert again.own_max_version_seen == 41


def test_the_file_round_trips_and_is_bounded(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    a_id, b_id = node(A, MAN).id, node(B, MAN).id
    view = LedgerView(MappingProxyType({a_id: Held(3, DIGEST, NOW), b_id: Held(7, DIGEST)}),
                      frozenset({b_id}))
    ledgerfile.save(state, view)
    loaded = ledgerfile.load(state)
    assert loaded is not None
    assert dict(loaded.held) == dict(view.held)
    assert loaded.flagged == view.flagged
    assert ledgerfile.encode(loaded) == ledgerfile.encode(view)
    too_many = {"format": 1, "flagged": [],
                "held": {f"x{i}": {"version": 1, "digest": DIGEST, "created_at": NOW}
                         for i in range(ledgerfile.MAX_LEDGER_ROWS + 1)}}
    with pytest.raises(ValueError, match="more than"):
        ledgerfile.decode(json.dumps(too_many).encode())


@pytest.mark.parametrize("body", [
    b"not json", b"[]", b'{"format": 2, "held": {}, "flagged": []}',
    b'{"format": 1, "held": {"12D3KooWnope": {"version": 1, "digest": "ab"}}, "flagged": []}',
    b'{"format": 1, "held": {}, "flagged": ["not a node id"]}',
])
def test_nonsense_in_an_intact_file_is_logged_and_ignored(
    tmp_path: Path, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    state = StateDir(tmp_path / "s")
    state.write_blob(ledgerfile.LEDGER_BLOB, body)
    with caplog.at_level(logging.ERROR):
        assert ledgerfile.load(state) is None
    assert "ledger file" in caplog.text


def test_a_corrupt_file_is_quarantined(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    ledgerfile.save(state, LedgerView(flagged=frozenset({node(A, MAN).id})))
    path = state.blob_path(ledgerfile.LEDGER_BLOB)
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01
    path.write_bytes(bytes(data))
    assert ledgerfile.load(state) is None
    assert [p.name.split(".")[0] for p in state.quarantine.iterdir()] == ["ledger"]


def test_a_flag_is_cleared_offline(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    a_id = node(A, MAN).id
    ledgerfile.save(state, LedgerView(MappingProxyType({a_id: Held(3, DIGEST)}),
                                      frozenset({a_id})))
    assert ledgerfile.clear_flag(state, a_id)
    assert not ledgerfile.clear_flag(state, a_id)
    loaded = ledgerfile.load(state)
    assert loaded is not None
    assert loaded.flagged == frozenset()
    assert loaded.held[a_id].version == 3  # its old versions stay refused
