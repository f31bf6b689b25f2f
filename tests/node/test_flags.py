"""Issue 24 item 3: a flag acts on what is already held. An origin caught equivocating,
revoked, dropped from the manifest or past its membership loses the entry the cache held
from before: out of the next blend at once, reported by :meth:`NodeState.withdraw` (what the
daemon writes to the participation audit), and again after a restart."""

from __future__ import annotations

from pathlib import Path

from peerd.core.reasons import Reason
from peerd.node.state import NodeState, Withdrawn, sign_own, verify
from peerd.protocol import messages as msg
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import public_key_bytes
from peerd.protocol.ledger import EquivocationError
from peerd.store import ledgerfile, persist
from peerd.store.statedir import StateDir
from tests.net.test_gossip import session
from tests.node.fleet import FLEET, NOW, SCHEMA, key, manifest, model, node
from tests.node.test_knowstate import knode, publish_knowledge

A, B, C = key(1), key(2), key(3)
MAN = manifest(A, B, C)


def signed(version: int, seed: int, at: float = NOW) -> msg.Entry:
    _, message = sign_own(A, FLEET, params=model(seed), version=version, created_at=at,
                          num_examples=5)
    return message


def offer(n: NodeState, message: msg.Entry, now: float = NOW) -> Reason | None:
    """As peerd.net.gossip delivers an entry: verified on a snapshot, flagged or accepted
    on the loop."""
    try:
        v = verify(message, fleet_id=FLEET, manifest=n.manifest, ledger=n.ledger.view(),
                   schema=SCHEMA, limits=n.limits, now=now)
    except ProtocolError as exc:
        if isinstance(exc, EquivocationError):
            n.flag(exc.origin)
        n.reject(exc.reason)
        return exc.reason
    return n.accept(v, sender="relay", now=now)


def a_id() -> str:
    return node(A, MAN).id


def test_an_equivocation_proven_in_the_worker_withdraws_the_held_entry() -> None:
    b = node(B, MAN)
    assert offer(b, signed(5, seed=0)) is None
    assert [i.meta.origin for i in b.cache] == [a_id()]
    assert offer(b, signed(5, seed=1)) is Reason.EQUIVOCATION
    # Before: A's version 5 stayed cached and blended (α = 1/2) until τ_max.
    assert b.cache == []
    assert b.blend_inputs() == []
    assert b.withdraw(NOW) == [Withdrawn(a_id(), 5, Reason.EQUIVOCATION)]
    assert b.withdraw(NOW) == []  # reported once
    assert b.rejected["equivocation"] == 1  # the refused entry; the withdrawal is audited


def test_an_equivocation_caught_at_accept_withdraws_the_held_entry() -> None:
    b = node(B, MAN)
    assert offer(b, signed(5, seed=0)) is None
    # Verified against a snapshot taken before the first copy landed: caught at accept.
    forged = verify(signed(5, seed=1), fleet_id=FLEET, manifest=MAN,
                    ledger=node(C, MAN).ledger.view(), schema=SCHEMA, limits=b.limits, now=NOW)
    assert b.accept(forged, sender="x", now=NOW) is Reason.EQUIVOCATION
    assert b.cache == []
    assert b.withdraw(NOW) == [Withdrawn(a_id(), 5, Reason.EQUIVOCATION)]


def test_a_flag_set_on_the_ledger_directly_is_swept_before_the_blend() -> None:
    b = node(B, MAN)
    assert offer(b, signed(5, seed=0)) is None
    b.ledger.flag(a_id())  # any path that flags: the round's sweep still catches it
    assert b.withdraw(NOW) == [Withdrawn(a_id(), 5, Reason.EQUIVOCATION)]
    assert b.cache == []


def test_after_a_restart_the_flagged_origins_entry_stays_out(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    b = node(B, MAN)
    assert offer(b, signed(5, seed=0)) is None
    persist.save_cache(state, b, set())  # the entry was on disk before the flag
    assert offer(b, signed(5, seed=1)) is Reason.EQUIVOCATION
    ledgerfile.save(state, b.ledger.view())
    again = node(B, MAN)  # Daemon._restore: the entries, then the ledger
    persist.restore(state, again, now=NOW + 10)
    assert [i.meta.origin for i in again.cache] == [a_id()]  # restored before the flags...
    stored = ledgerfile.load(state)
    assert stored is not None
    again.restore_ledger(stored)
    assert again.cache == []  # ...and out once they are known
    assert again.withdraw(NOW + 10) == [Withdrawn(a_id(), 5, Reason.EQUIVOCATION)]


def test_a_revoked_member_is_withdrawn_and_reported() -> None:
    b = node(B, MAN)
    assert offer(b, signed(5, seed=0)) is None
    b.install_manifest(MAN.revoke(a_id()), None, NOW)
    assert b.cache == []
    assert b.withdraw(NOW) == [Withdrawn(a_id(), 5, Reason.REVOKED)]


def test_a_membership_that_ends_by_time_withdraws_the_entry() -> None:
    man = MAN.admit(public_key_bytes(A), NOW + 60)  # A admitted until NOW + 60
    b = node(B, man)
    assert offer(b, signed(5, seed=0)) is None
    assert b.withdraw(NOW + 30) == []
    # No new manifest: the membership simply ended, and the entry must not be blended.
    assert b.withdraw(NOW + 61) == [Withdrawn(a_id(), 5, Reason.EXPIRED)]
    assert b.cache == []


def test_a_flagged_knowledge_origin_loses_its_knowledge_and_keys() -> None:
    ka, kb = key(11), key(12)
    a, b = knode(ka, ka, kb), knode(kb, ka, kb)
    publish_knowledge(b, 8, rows=4, seed=2)
    session(a, b)
    assert [i.meta.origin for i in a.cache] == [b.id]
    assert b.id in a.keys
    a.flag(b.id)  # as the session does when a worker proves an equivocation
    assert a.cache == []
    assert a.keys == {}
    assert a.batches() == []
    assert a.views() == []
    assert a.withdraw(NOW) == [Withdrawn(b.id, 8, Reason.EQUIVOCATION)]
