"""The cache group in an entry's signed body: absent means the old bytes, present means a
bounded ASCII label; every hostile value is refused as malformed after the signature."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.reasons import Reason
from peerd.protocol.admission import admit_entry, entry_frame_limit
from peerd.protocol.entry import EntryBody, group_problem, sign_entry
from peerd.protocol.envelope import ENTRY_DOMAIN, SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.frames import FrameDecoder
from peerd.protocol.knowledge import KnowledgeSchema, admit_typed, sign_keys, sign_knowledge
from peerd.protocol.ledger import OriginLedger
from peerd.protocol.limits import MAX_GROUP_LEN, MAX_STR_LEN
from peerd.protocol.messages import Entry, decode_frame
from peerd.protocol.wire import pack
from tests.protocol.helpers import (
    ALICE,
    FLEET,
    NOW,
    SCHEMA,
    SCHEMA_ID,
    admit_kwargs,
    entry,
    surviving_bit_flips,
    tensors,
)


def grouped(group: str | None, version: int = 1) -> Entry:
    return sign_entry(ALICE, FLEET, version=version, created_at=NOW, schema_id=SCHEMA_ID,
                      num_examples=10, tensors=tensors(), group=group).to_message()


def body_dict(message: Entry) -> dict[str, Any]:
    out: dict[str, Any] = msgpack.unpackb(message.envelope.body, raw=False)
    return out


def signed_body(body: bytes, payload: bytes | bytearray | memoryview) -> Entry:
    """An entry whose body bytes the origin really signed, whatever they say."""
    return Entry(SignedEnvelope.sign(ALICE, ENTRY_DOMAIN, FLEET, body), payload)


def refusal(message: Entry) -> Reason:
    with pytest.raises(ProtocolError) as info:
        admit_entry(message, **admit_kwargs())
    return info.value.reason


def test_no_group_keeps_the_old_bytes() -> None:
    plain, none = entry(), grouped(None)
    assert none.envelope.body == plain.envelope.body  # the golden vectors pin these bytes
    assert none.envelope.sig == plain.envelope.sig
    assert "group" not in body_dict(plain)
    assert EntryBody.from_bytes(plain.envelope.body).group is None


def test_a_group_is_signed_admitted_and_read_back() -> None:
    message = grouped("ward:east-3")
    assert body_dict(message)["group"] == "ward:east-3"
    verified = admit_entry(message, **admit_kwargs())
    assert verified.body.group == "ward:east-3"
    # The label is covered by the signature: another label under the same signature fails.
    body = body_dict(message)
    body["group"] = "ward:west-3"
    forged = Entry(dataclasses.replace(message.envelope, body=pack(body)), message.payload)
    assert refusal(forged) is Reason.BAD_SIGNATURE


def test_knowledge_entries_carry_a_group_too() -> None:
    ks = KnowledgeSchema(key_dim=4, num_classes=3, encoder="test-encoder", max_samples=8)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    keys = sign_keys(ALICE, FLEET, schema=ks, version=1, created_at=NOW,
                     keys=x / np.linalg.norm(x, axis=1, keepdims=True),
                     labels=np.array([0, 1, 2]))
    know = sign_knowledge(ALICE, FLEET, schema=ks, version=2, created_at=NOW,
                          ids=np.array([0, 2]), logits=np.zeros((2, 3), np.float32),
                          keys_digest=keys.body.digest, group="site-1").to_message()
    verified = admit_typed(know, **{**admit_kwargs(), "schema": ks})
    assert verified.body.group == "site-1"
    assert "group" not in body_dict(keys.to_message())  # keys entries are never counted


OVERLONG = "g" * (MAX_GROUP_LEN + 1)


@pytest.mark.parametrize("value", [
    "",  # empty: one encoding for "no group" (the key's absence)
    OVERLONG,
    "x" * (MAX_STR_LEN + 1),  # beyond the decoder's string bound: refused before allocation
    "site 1", "site/1", "a\nb", "a\x1b[2J", "site-\u2160", "caf\u00e9",  # outside the charset
    7, 1.5, True, None, b"site-1", ["site-1"], {"g": 1},  # wrong types
])
def test_hostile_groups_are_malformed(value: object) -> None:
    base = grouped("site-1")
    body = {**body_dict(base), "group": value}
    assert refusal(signed_body(pack(body), base.payload)) is Reason.MALFORMED


def test_a_group_that_is_not_utf8_is_malformed() -> None:
    base = grouped("abcd")
    raw = base.envelope.body
    label = b"\xa4abcd"  # msgpack fixstr of 4 bytes
    assert raw.count(label) == 1
    body = raw.replace(label, b"\xa4\xff\xfe\xc3\x28")  # invalid UTF-8 under a str header
    assert refusal(signed_body(body, base.payload)) is Reason.MALFORMED


@pytest.mark.parametrize("value", ["", OVERLONG, "a b", "\u00e9", 3])
def test_signing_refuses_what_admission_would(value: Any) -> None:
    assert group_problem(value) is not None
    with pytest.raises(ValueError, match="group"):
        grouped(value)


@pytest.mark.parametrize("value", ["a", "site-1", "ward:east_3.b", "A" * MAX_GROUP_LEN])
def test_valid_labels(value: str) -> None:
    assert group_problem(value) is None
    assert admit_entry(grouped(value), **admit_kwargs()).body.group == value


def pipeline(stream: bytes) -> None:
    dec = FrameDecoder(entry_frame_limit(SCHEMA))
    frames = dec.feed(stream)
    dec.close()
    for frame in frames:
        message = decode_frame(frame)
        if isinstance(message, Entry):
            admit_entry(message, **{**admit_kwargs(), "ledger": OriginLedger()})


def test_every_single_bit_flip_of_a_grouped_frame_is_rejected() -> None:
    frame = grouped("site-1").to_wire()
    pipeline(frame)
    assert surviving_bit_flips(frame, pipeline) == []


values = st.none() | st.booleans() | st.integers(-(2**64), 2**64 - 1) | st.floats() \
    | st.text(max_size=80) | st.binary(max_size=80) \
    | st.lists(st.integers(-5, 5) | st.text(max_size=5), max_size=4)


@settings(max_examples=300, deadline=None)
@given(value=values)
def test_any_signed_group_is_admitted_or_malformed(value: object) -> None:
    base = grouped("site-1")
    try:
        body = pack({**body_dict(base), "group": value})
    except (OverflowError, ValueError, TypeError):
        return  # not encodable as msgpack
    message = signed_body(body, base.payload)
    if group_problem(value) is not None:
        with pytest.raises(ProtocolError) as info:
            admit_entry(message, **admit_kwargs())
        assert info.value.reason is Reason.MALFORMED
        return
    verified = admit_entry(message, **admit_kwargs())
    assert verified.body.group == value
    assert group_problem(value) is None
    assert hashlib.sha256(verified.message.envelope.body).digest() == hashlib.sha256(body).digest()
