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
            v = verify(m, fleet_id=FLEET, manifest=to.manifest, ledger=to.ledger,
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
        verify(message, fleet_id=FLEET, manifest=MAN, ledger=b.ledger, schema=SCHEMA,
               limits=b.limits, now=NOW)
    assert exc.value.reason is Reason.NOT_MEMBER


def test_replayed_entry_is_not_newer_and_counted_apart_from_attacks() -> None:
    a, b = node(A, MAN), node(B, MAN)
    message = publish(a, 4)
    deliver(a, b)
    # verification consults the ledger first, so a replay costs no 44 MB hash
    with pytest.raises(ProtocolError) as exc:
        verify(message, fleet_id=FLEET, manifest=MAN, ledger=b.ledger, schema=SCHEMA,
               limits=b.limits, now=NOW + 1)
    assert exc.value.reason is Reason.NOT_NEWER
    # one verified before the first copy landed is caught again when accepted
    early = verify(message, fleet_id=FLEET, manifest=MAN, ledger=node(C, MAN).ledger,
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
    v = verify(forged, fleet_id=FLEET, manifest=MAN, ledger=node(C, MAN).ledger,
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
        verify(tampered, fleet_id=FLEET, manifest=MAN, ledger=node(B, MAN).ledger,
               schema=SCHEMA, limits=a.limits, now=NOW)
    assert exc.value.reason is Reason.PAYLOAD_MISMATCH


def test_signed_nan_weights_are_refused_by_core_validation() -> None:
    bad = model()
    bad["fc.bias"][0] = float("nan")
    _, message = sign_own(A, FLEET, params=bad, version=1, created_at=NOW, num_examples=5)
    with pytest.raises(ProtocolError) as exc:
        verify(message, fleet_id=FLEET, manifest=MAN, ledger=node(B, MAN).ledger,
               schema=SCHEMA, limits=node(B, MAN).limits, now=NOW)
    assert exc.value.reason is Reason.NON_FINITE


def test_wrong_shape_from_a_member_is_refused() -> None:
    other = {"fc.weight": torch.zeros(5, 3), "fc.bias": torch.zeros(5)}
    _, message = sign_own(A, FLEET, params=other, version=1, created_at=NOW, num_examples=5)
    with pytest.raises(ProtocolError) as exc:
        verify(message, fleet_id=FLEET, manifest=MAN, ledger=node(B, MAN).ledger,
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
