"""Entry admission: membership, replay, rollback, equivocation, skew, payload lies."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

from peerd.core.reasons import Reason
from peerd.protocol.admission import admit_entry, entry_frame_limit
from peerd.protocol.entry import EntryBody
from peerd.protocol.envelope import ENTRY_DOMAIN, SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.frames import FrameDecoder
from peerd.protocol.identity import node_id_of, public_key_bytes
from peerd.protocol.ledger import OriginLedger
from peerd.protocol.messages import Entry, decode_frame
from tests.protocol.helpers import (
    ALICE,
    BOB,
    FLEET,
    MALLORY,
    NOW,
    OTHER_FLEET,
    SCHEMA,
    admit_kwargs,
    entry,
    manifest,
    tensors,
)


def refused(msg: Entry, **kw: Any) -> Reason:
    with pytest.raises(ProtocolError) as exc:
        admit_entry(msg, **admit_kwargs(**kw))
    return exc.value.reason


def resign(msg: Entry, key: Any = ALICE, **changes: Any) -> Entry:
    """Re-sign a modified body with ``key`` (an attacker holding a member key)."""
    body = EntryBody.from_bytes(msg.envelope.body)
    fields = {f: getattr(body, f) for f in body.__slots__}
    fields.update(changes)
    new = EntryBody(**fields).to_bytes()
    return Entry(SignedEnvelope.sign(key, ENTRY_DOMAIN, FLEET, new), msg.payload)


def test_valid_entry_through_the_frame_decoder() -> None:
    wire = entry().to_wire()
    dec = FrameDecoder(entry_frame_limit(SCHEMA))
    frames = [f for i in range(0, len(wire), 7) for f in dec.feed(wire[i : i + 7])]
    msg = decode_frame(frames[0])
    assert isinstance(msg, Entry)
    ok = admit_entry(msg, **admit_kwargs())
    assert ok.body.origin == node_id_of(ALICE)
    assert ok.body.digest == hashlib.sha256(bytes(msg.payload)).hexdigest()
    np.testing.assert_array_equal(ok.tensors["fc.weight"], tensors()["fc.weight"])


def test_relayed_entry_keeps_the_origin_signature_untouched() -> None:
    ledger = OriginLedger()
    first = admit_entry(decode_frame(entry().to_wire()[4:]), **admit_kwargs(ledger))  # type: ignore[arg-type]
    relayed = first.message.to_wire()
    assert relayed == entry().to_wire()
    again = decode_frame(relayed[4:])
    assert isinstance(again, Entry)
    assert again.envelope.sig == entry().envelope.sig


def test_unknown_key() -> None:
    assert refused(entry(MALLORY)) is Reason.NOT_MEMBER


def test_revoked_key() -> None:
    m = manifest().revoke(node_id_of(ALICE))
    assert refused(entry(ALICE), manifest=m) is Reason.REVOKED
    admit_entry(entry(BOB), **admit_kwargs(manifest=m))


def test_expired_member() -> None:
    m = manifest(**{node_id_of(ALICE): NOW - 1})
    assert refused(entry(ALICE), manifest=m) is Reason.EXPIRED
    admit_entry(entry(ALICE), **admit_kwargs(manifest=m, now=NOW - 1))  # boundary: still valid


def test_replay() -> None:
    ledger = OriginLedger()
    admit_entry(entry(version=3), **admit_kwargs(ledger))
    assert refused(entry(version=3), ledger=ledger) is Reason.NOT_NEWER


def test_rollback() -> None:
    ledger = OriginLedger()
    admit_entry(entry(version=3), **admit_kwargs(ledger))
    assert refused(entry(version=2), ledger=ledger) is Reason.NOT_NEWER
    admit_entry(entry(version=4), **admit_kwargs(ledger))


def test_equivocation_flags_the_origin() -> None:
    ledger = OriginLedger()
    admit_entry(entry(version=3), **admit_kwargs(ledger))
    assert refused(entry(version=3, scale=2.0), ledger=ledger) is Reason.EQUIVOCATION
    assert node_id_of(ALICE) in ledger.flagged
    # Even a newer version is refused until an operator clears the flag.
    assert refused(entry(version=9), ledger=ledger) is Reason.EQUIVOCATION
    ledger.clear_flag(node_id_of(ALICE))
    admit_entry(entry(version=9), **admit_kwargs(ledger))
    admit_entry(entry(BOB, version=3), **admit_kwargs(ledger))  # other origins unaffected


def test_future_timestamp() -> None:
    assert refused(entry(created_at=NOW + 301)) is Reason.FUTURE_TIMESTAMP
    admit_entry(entry(created_at=NOW + 299), **admit_kwargs())
    assert refused(entry(created_at=NOW + 10), max_skew=5.0) is Reason.FUTURE_TIMESTAMP


def test_wrong_fleet() -> None:
    assert refused(entry(fleet=OTHER_FLEET)) is Reason.WRONG_FLEET


def test_member_signing_for_another_origin() -> None:
    forged = resign(entry(ALICE), key=BOB, origin=node_id_of(ALICE))
    assert refused(forged) is Reason.BAD_SIGNATURE


def test_key_swapped_for_another_members_key() -> None:
    msg = entry(ALICE)
    env = msg.envelope
    swapped = Entry(
        SignedEnvelope(env.fleet_id, public_key_bytes(BOB), env.body, env.sig), msg.payload
    )
    assert refused(swapped) is Reason.BAD_SIGNATURE


def test_payload_longer_or_shorter_than_claimed() -> None:
    msg = entry()
    assert refused(Entry(msg.envelope, bytes(msg.payload) + b"\x00")) is Reason.PAYLOAD_MISMATCH
    assert refused(Entry(msg.envelope, bytes(msg.payload)[:-1])) is Reason.PAYLOAD_MISMATCH


def test_payload_swapped_under_a_valid_signature() -> None:
    msg = entry()
    other = entry(scale=3.0)
    assert refused(Entry(msg.envelope, other.payload)) is Reason.PAYLOAD_MISMATCH


def test_signed_payload_larger_than_the_local_schema() -> None:
    arrays = {**tensors(), "extra": np.zeros(1000, np.float32)}
    assert refused(entry(arrays=arrays)) is Reason.TOO_LARGE


def test_shape_mismatch_with_same_total_size() -> None:
    arrays = {**tensors(), "fc.weight": np.zeros((4, 3), np.float32)}
    assert refused(entry(arrays=arrays)) is Reason.SHAPE_MISMATCH


def test_non_finite_values_pass_protocol_but_are_visible() -> None:
    # The protocol carries NaN faithfully (the signature covers it); the core validator and
    # tensors.check_finite refuse it. Here we only check it is not silently altered.
    arrays = tensors()
    arrays["fc.bias"][0] = np.nan
    ok = admit_entry(entry(arrays=arrays), **admit_kwargs())
    assert np.isnan(ok.tensors["fc.bias"][0])


def test_no_record_leaves_the_ledger_untouched() -> None:
    ledger = OriginLedger()
    admit_entry(entry(version=3), **admit_kwargs(ledger), record=False)
    assert ledger.held == {}


def test_model_with_thousands_of_tensors_fits_the_entry_head() -> None:
    arrays = {f"block{i:04d}.layer.weight": np.full(2, i, np.float32) for i in range(3000)}
    schema = {n: ("float32", (2,)) for n in arrays}
    wire = entry(arrays=arrays).to_wire()
    msg = decode_frame(FrameDecoder(entry_frame_limit(schema)).feed(wire)[0])
    assert isinstance(msg, Entry)
    ok = admit_entry(msg, **admit_kwargs(schema=schema))
    assert len(ok.tensors) == 3000
    assert ok.tensors["block2999.layer.weight"][1] == 2999
