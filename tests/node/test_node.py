"""Node gossip state: what to ask for, what to send, and every way an entry is refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from peerd.core.reasons import Reason
from peerd.node.state import Held, NodeState, sign_own, verify
from peerd.protocol import messages as msg
from peerd.protocol.errors import ProtocolError
from tests.node.fleet import FLEET, NOW, SCHEMA, key, manifest, model, node

A, B, C, OUT = key(1), key(2), key(3), key(9)
MAN = manifest(A, B, C)


def publish(n: NodeState, version: int, seed: int = 0, at: float = NOW) -> msg.Entry:
    entry, message = sign_own(n.key, FLEET, params=model(seed), version=version, created_at=at,
                              num_examples=50)
    n.set_own(entry, message)
    return message


def deliver(frm: NodeState, to: NodeState, now: float = NOW) -> list[Reason | None]:
    """One direction of a gossip exchange, as the session will run it."""
    want = to.wants(frm.digest(), now)
    out: list[Reason | None] = []
    for m in (h.message for h in frm.to_send(want)):
        try:
            v = verify(m, fleet_id=FLEET, manifest=to.manifest, ledger=to.ledger.view(),
                       schema=SCHEMA, limits=to.limits, now=now)
        except ProtocolError as exc:
            to.reject(exc.reason)
            out.append(exc.reason)
            continue
        out.append(to.accept(v, sender=frm.id, now=now))
    return out


def test_a_fresh_member_entry_is_wanted_verified_and_cached() -> None:
    a, b = node(A, MAN), node(B, MAN)
    publish(a, 1)
    assert b.wants(a.digest(), NOW).items == ((a.id, 1),)
    assert deliver(a, b) == [None]
    assert [i.meta.origin for i in b.cache] == [a.id]
    assert b.cache[0].received_from == a.id
    # and it is not asked for a second time
    assert b.wants(a.digest(), NOW).items == ()


def test_relay_keeps_the_origin_signature_untouched() -> None:
    a, b, c = node(A, MAN), node(B, MAN), node(C, MAN)
    original = publish(a, 3)
    deliver(a, b)
    publish(b, 1)
    assert deliver(b, c) == [None, None]
    held = {i.meta.origin: i for i in c.cache}
    assert held[a.id].received_from == b.id
    payload = held[a.id].payload
    assert isinstance(payload, Held)  # a node's cache items carry their Held
    relayed = payload.message
    assert relayed.envelope == original.envelope  # byte-identical envelope, A's signature
    assert bytes(relayed.payload) == bytes(original.payload)


def test_newer_version_replaces_older_one_through_a_relay() -> None:
    a, b, c = node(A, MAN), node(B, MAN), node(C, MAN)
    publish(a, 1)
    deliver(a, c)  # C holds A@1
    publish(a, 2, seed=1)
    deliver(a, b)  # B holds A@2
    assert c.wants(b.digest(), NOW).items == ((a.id, 2),)
    deliver(b, c)
    assert [(i.meta.origin, i.meta.version) for i in c.cache] == [(a.id, 2)]


def test_outsider_entry_is_not_even_requested_and_rejected_if_pushed() -> None:
    outsider = node(OUT, MAN)
    b = node(B, MAN)
    message = publish(outsider, 1)
    assert b.wants(outsider.digest(), NOW).items == ()
    with pytest.raises(ProtocolError) as exc:
        verify(message, fleet_id=FLEET, manifest=MAN, ledger=b.ledger.view(), schema=SCHEMA,
               limits=b.limits, now=NOW)
    assert exc.value.reason is Reason.NOT_MEMBER


def test_replayed_entry_is_not_newer_and_counted_apart_from_attacks() -> None:
    a, b = node(A, MAN), node(B, MAN)
    message = publish(a, 4)
    deliver(a, b)
    # verification consults the ledger first, so a replay costs no 44 MB hash
    with pytest.raises(ProtocolError) as exc:
        verify(message, fleet_id=FLEET, manifest=MAN, ledger=b.ledger.view(), schema=SCHEMA,
               limits=b.limits, now=NOW + 1)
    assert exc.value.reason is Reason.NOT_NEWER
    # one verified before the first copy landed is caught again when accepted
    early = verify(message, fleet_id=FLEET, manifest=MAN, ledger=node(C, MAN).ledger.view(),
                   schema=SCHEMA, limits=b.limits, now=NOW + 1)
    assert b.accept(early, sender="x", now=NOW + 1) is Reason.NOT_NEWER
    b.reject(exc.value.reason)
    assert b.dropped["not_newer"] == 2
    assert not b.rejected


def test_equivocating_origin_is_rejected_and_flagged() -> None:
    a, b = node(A, MAN), node(B, MAN)
    publish(a, 5, seed=0)
    deliver(a, b)
    _, forged = sign_own(A, FLEET, params=model(seed=7), version=5, created_at=NOW,
                         num_examples=50)
    v = verify(forged, fleet_id=FLEET, manifest=MAN, ledger=node(C, MAN).ledger.view(),
               schema=SCHEMA, limits=b.limits, now=NOW)
    assert b.accept(v, sender="x", now=NOW) is Reason.EQUIVOCATION
    assert a.id in b.ledger.flagged
    assert b.rejected["equivocation"] == 1


def test_tampered_payload_fails_verification() -> None:
    a = node(A, MAN)
    message = publish(a, 1)
    payload = bytearray(message.payload)
    payload[3] ^= 0x01
    tampered = dataclasses.replace(message, payload=bytes(payload))
    with pytest.raises(ProtocolError) as exc:
        verify(tampered, fleet_id=FLEET, manifest=MAN, ledger=node(B, MAN).ledger.view(),
               schema=SCHEMA, limits=a.limits, now=NOW)
    assert exc.value.reason is Reason.PAYLOAD_MISMATCH


def test_signed_nan_weights_are_refused_by_core_validation() -> None:
    bad = model()
    bad["fc.bias"][0] = float("nan")
    _, message = sign_own(A, FLEET, params=bad, version=1, created_at=NOW, num_examples=5)
    with pytest.raises(ProtocolError) as exc:
        verify(message, fleet_id=FLEET, manifest=MAN, ledger=node(B, MAN).ledger.view(),
               schema=SCHEMA, limits=node(B, MAN).limits, now=NOW)
    assert exc.value.reason is Reason.NON_FINITE


def test_wrong_shape_from_a_member_is_refused() -> None:
    other = {"fc.weight": torch.zeros(5, 3), "fc.bias": torch.zeros(5)}
    _, message = sign_own(A, FLEET, params=other, version=1, created_at=NOW, num_examples=5)
    with pytest.raises(ProtocolError) as exc:
        verify(message, fleet_id=FLEET, manifest=MAN, ledger=node(B, MAN).ledger.view(),
               schema=SCHEMA, limits=node(B, MAN).limits, now=NOW)
    assert exc.value.reason in (Reason.TOO_LARGE, Reason.PAYLOAD_MISMATCH, Reason.SHAPE_MISMATCH)


def test_stale_entries_are_neither_wanted_nor_kept_and_expire_from_the_cache() -> None:
    a, b = node(A, MAN), node(B, MAN, tau_max=60)
    publish(a, 1, at=NOW - 120)
    assert b.wants(a.digest(), NOW).items == ()
    publish(a, 2, at=NOW)
    deliver(a, b)
    assert len(b.cache) == 1
    assert [i.meta.version for i in b.expire(NOW + 61)] == [2]
    assert b.cache == []
    assert b.dropped["stale"] == 1


def test_capacity_means_only_entries_that_would_survive_are_fetched() -> None:
    relay = node(A, manifest(A, B, C, key(4), key(5)))
    members = [node(k, relay.manifest) for k in (B, C, key(4), key(5))]
    for i, m in enumerate(members):
        publish(m, 1, at=NOW - 10 * i)  # B freshest, key(5) oldest
        deliver(m, relay)
    small = node(key(4), relay.manifest, capacity=2)
    publish(small, 1)
    want = small.wants(relay.digest(), NOW)
    # small's own entry is skipped; of the other three, the two freshest are asked for
    assert [o for o, _ in want.items] == [members[0].id, members[1].id]


def test_own_entry_relayed_back_is_not_requested() -> None:
    a, b = node(A, MAN), node(B, MAN)
    publish(a, 1)
    deliver(a, b)
    assert a.wants(b.digest(), NOW).items == ()


def test_revocation_by_newer_manifest_evicts_the_cached_entry() -> None:
    a, b = node(A, MAN), node(B, MAN)
    publish(a, 1)
    deliver(a, b)
    newer = MAN.revoke(a.id)
    b.install_manifest(newer, None, NOW)
    assert b.cache == []
    assert b.rejected["revoked"] == 1


def test_a_node_that_lost_its_state_publishes_past_what_its_peers_hold() -> None:
    # Issue 12 item 1: A publishes v9, B caches it; A restarts with an empty state (its key
    # kept) and publishes v1. Before, A never asked for its own entries: its next one was v2,
    # which B never fetched (2 <= 9), so A was ignored for as many rounds as it had run.
    a, b = node(A, MAN), node(B, MAN)
    publish(a, 9)
    assert deliver(a, b) == [None]
    restarted = node(A, MAN)
    publish(restarted, 1, seed=3)
    assert restarted.wants(b.digest(), NOW + 5).items == ((a.id, 9),)
    # It fetches its own v9 back, verifies its own signature on it, and only learns from it.
    assert deliver(b, restarted, now=NOW + 5) == [Reason.OWN_ORIGIN]
    assert restarted.own_max_version_seen == 9
    assert restarted.cache == []
    assert restarted.wants(b.digest(), NOW + 5).items == ()  # asked once, not every session
    # The daemon's choice of the next version (peerd.daemon.daemon: _round).
    version = max(1, restarted.own_max_version_seen) + 1
    assert version == 10
    publish(restarted, version, seed=4, at=NOW + 10)
    assert deliver(restarted, b, now=NOW + 10) == [None]
    assert [(i.meta.origin, i.meta.version) for i in b.cache] == [(a.id, 10)]
    assert not b.rejected


def test_a_digest_alone_never_raises_the_own_version() -> None:
    # The Digest is unsigned: a member claiming to hold our version 10**9 gets asked for
    # it, but only an entry signed with our own key would move our counter (admission
    # refuses a body whose origin is not its signer's: test_protocol_admission).
    a, b = node(A, MAN), node(B, MAN)
    publish(a, 2)
    lie = msg.Digest((msg.DigestItem(a.id, 10**9, NOW, b"\x01" * 32),))
    assert a.wants(lie, NOW).items == ((a.id, 10**9),)
    assert b.to_send(a.wants(lie, NOW)) == []  # it holds no such entry: nothing comes
    assert a.own_max_version_seen == -1
    # Nor is a version beyond what time allows even asked for (it could never verify).
    absurd = msg.Digest((msg.DigestItem(a.id, 2**63 - 1, NOW, b"\x01" * 32),))
    assert a.wants(absurd, NOW).items == ()


def test_an_entry_too_far_ahead_of_the_held_one_is_neither_wanted_nor_accepted() -> None:
    # Issue 12 item 14: a member jumping to the int64 ceiling could never publish again.
    a, b = node(A, MAN), node(B, MAN)
    publish(a, 3)
    deliver(a, b)
    huge = node(A, MAN)
    publish(huge, 2**63 - 1, seed=2, at=NOW + 1)
    assert b.wants(huge.digest(), NOW + 1).items == ()
    assert huge.own is not None
    with pytest.raises(ProtocolError) as exc:
        verify(huge.own.message, fleet_id=FLEET, manifest=MAN, ledger=b.ledger.view(),
               schema=SCHEMA, limits=b.limits, now=NOW + 1)
    assert exc.value.reason is Reason.VERSION_TOO_HIGH
    publish(a, 4, seed=1, at=NOW + 1)  # the honest next version still gets through
    assert deliver(a, b, now=NOW + 1) == [None]
