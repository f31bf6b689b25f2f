"""Issue 24 item 3, through a real weight-mode ``Daemon`` object (its rounds run, no
sockets): a member caught equivocating, or revoked, is out of the next round's blend, and
the participation audit (``peerd audit``) says why; the flag keeps it out after a restart."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import trio

from peerd.daemon.daemon import Daemon
from peerd.node.state import sign_own
from peerd.protocol import messages as msg
from peerd.protocol.errors import ProtocolError
from peerd.protocol.ledger import EquivocationError
from peerd.store.keyfile import NODE_KEY_FILE, read_private_key
from tests.daemon.test_daemon_membership import _daemon


def _first(tmp_path: Path) -> Daemon:
    d = _daemon(tmp_path, admitted=True)
    cfg = dataclasses.replace(d.cfg, learning=dataclasses.replace(
        d.cfg.learning, local_steps=2, batch_size=16))
    return Daemon(cfg)


def _entry(d: Daemon, tmp_path: Path, version: int, shift: float) -> msg.Entry:
    """An entry of the other member (its key from `peerd keygen`), shaped like our model."""
    other = read_private_key(tmp_path / "other" / NODE_KEY_FILE)
    params = {k: v + shift for k, v in d.model.state_dict().items()}
    _, message = sign_own(other, d.cfg.fleet.fleet_id, params=params, version=version,
                          created_at=d.now(), num_examples=10)
    return message


def _deliver(d: Daemon, message: msg.Entry) -> str | None:
    """As a session delivers an entry (peerd.net.gossip._receive_entry)."""
    try:
        verified = d.node.verifier(message, None, d.now())()
    except ProtocolError as exc:
        if isinstance(exc, EquivocationError):
            d.node.flag(exc.origin)
        return str(exc.reason)
    reason = d.node.accept(verified, sender="relay", now=d.now())
    return None if reason is None else str(reason)


def _last_record(d: Daemon) -> dict[str, Any]:
    trio.run(d._round)
    record: dict[str, Any] = d.participation.answer(None)["records"][-1]
    return record


def _origins(record: dict[str, Any]) -> list[str]:
    return [m["origin"] for m in record["members"]]


def test_an_equivocating_members_held_entry_leaves_the_next_blend(tmp_path: Path) -> None:
    d = _first(tmp_path)
    assert _deliver(d, _entry(d, tmp_path, 1, 0.01)) is None
    other = d.node.cache[0].meta.origin
    assert other in _origins(_last_record(d))  # blended while it was trusted
    d._persist()  # its entry is on disk, as after the session that brought it
    assert _deliver(d, _entry(d, tmp_path, 1, 0.02)) == "equivocation"
    trio.run(d._save_ledger)
    record = _last_record(d)
    # Before: the entry stayed in the blend with α = 1/2 until τ_max.
    assert _origins(record) == [d.node.id]
    assert record["withdrawn"] == [{"origin": other, "version": 1, "reason": "equivocation"}]
    events = [e for e in d.state.read_audit() if e["event"] == "withdrawn"]
    assert [(e["origin"], e["reason"]) for e in events] == [(other, "equivocation")]

    again = Daemon(d.cfg)  # the restart: the entry is reloaded, the flag too
    assert again.node.cache == []
    record = _last_record(again)
    assert _origins(record) == [again.node.id]
    assert record["withdrawn"] == [{"origin": other, "version": 1, "reason": "equivocation"}]


def test_a_revoked_members_held_entry_leaves_the_next_blend(tmp_path: Path) -> None:
    d = _first(tmp_path)
    assert _deliver(d, _entry(d, tmp_path, 1, 0.01)) is None
    other = d.node.cache[0].meta.origin
    d.node.install_manifest(d.node.manifest.revoke(other), None, d.now())
    record = _last_record(d)
    assert _origins(record) == [d.node.id]
    assert record["withdrawn"] == [{"origin": other, "version": 1, "reason": "revoked"}]
