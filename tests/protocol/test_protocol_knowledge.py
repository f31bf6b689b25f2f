"""Knowledge and keys entries: layouts, admission, hostile values, bit flips, the decoder
invariant, and that weight entries and Digests keep their bytes."""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.reasons import Reason
from peerd.protocol.admission import admit_entry
from peerd.protocol.entry import EntryBody, sign_entry
from peerd.protocol.envelope import ENTRY_DOMAIN, SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.frames import FrameDecoder, encode_frame
from peerd.protocol.kinds import KEYS, KNOWLEDGE, WEIGHTS
from peerd.protocol.knowledge import (
    KnowledgeSchema,
    admit_typed,
    join_rows,
    sign_keys,
    sign_knowledge,
)
from peerd.protocol.ledger import OriginLedger
from peerd.protocol.limits import MAX_LOGIT_ABS
from peerd.protocol.messages import Digest, DigestItem, Entry, decode_frame
from peerd.protocol.wire import pack
from tests.protocol.helpers import (
    ALICE,
    BOB,
    FLEET,
    MALLORY,
    NOW,
    admit_kwargs,
    entry,
    surviving_bit_flips,
)

KS = KnowledgeSchema(key_dim=4, num_classes=3, encoder="test-encoder", max_samples=8)


def unit_keys(n: int, d: int = 4, seed: int = 0) -> npt.NDArray[np.float32]:
    x = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    out: npt.NDArray[np.float32] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


LABELS = np.array([0, 1, 2, 1, 0], dtype=np.int64)
KEYS_ENTRY = sign_keys(ALICE, FLEET, schema=KS, version=1, created_at=NOW - 10,
                       keys=unit_keys(5), labels=LABELS)
IDS = np.array([0, 2, 4], dtype=np.int32)
LOGITS = np.array([[1.5, -0.5, 0.0], [0.25, 2.0, -1.0], [3.0, 0.5, -2.5]], dtype=np.float32)


def knowledge(version: int = 2, *, signer: Any = ALICE, ids: Any = IDS, logits: Any = LOGITS,
              keys_digest: str | None = None, schema: KnowledgeSchema = KS) -> Entry:
    return sign_knowledge(signer, FLEET, schema=schema, version=version, created_at=NOW,
                          ids=ids, logits=logits,
                          keys_digest=keys_digest or KEYS_ENTRY.body.digest).to_message()


def admit(message: Entry, ledger: OriginLedger | None = None, **kw: Any) -> Any:
    args = {**admit_kwargs(ledger), "schema": KS, **kw}
    return admit_typed(message, **args)


def forged(body: dict[str, Any], payload: bytes | bytearray | memoryview = b"",
           signer: Any = ALICE) -> Entry:
    """An entry whose body the origin really signed, whatever it says."""
    return Entry(SignedEnvelope.sign(signer, ENTRY_DOMAIN, FLEET, pack(body)), payload)


def body_dict(message: Entry) -> dict[str, Any]:
    out: dict[str, Any] = msgpack.unpackb(message.envelope.body, raw=False)
    return out


def refusal(fn: Any, *args: Any, **kw: Any) -> Reason:
    with pytest.raises(ProtocolError) as info:
        fn(*args, **kw)
    return info.value.reason


# ------------------------------------------------------------------ the happy path


def test_keys_then_knowledge_are_admitted_and_joined() -> None:
    ledger = OriginLedger()
    keys = admit(KEYS_ENTRY.to_message(), ledger)
    know = admit(knowledge(), ledger)
    assert (keys.body.kind, know.body.kind) == (KEYS, KNOWLEDGE)
    assert know.body.keys_digest == keys.body.digest == KEYS_ENTRY.body.digest
    assert (know.body.num_examples, keys.body.num_examples) == (3, 5)
    k, labels, logits = join_rows(keys.tensors, know.tensors)
    assert labels.tolist() == [0, 2, 0]
    np.testing.assert_allclose(k, unit_keys(5)[[0, 2, 4]], atol=2e-3)  # float16 on the wire
    np.testing.assert_array_equal(logits, LOGITS)  # these values are exact in float16
    assert ledger.held[know.body.origin].version == 2  # knowledge is recorded ...


def test_keys_entries_are_content_addressed_not_versioned() -> None:
    # ... keys are not: the same keys entry twice is fine (used by reference, not by version)
    ledger = OriginLedger()
    admit(KEYS_ENTRY.to_message(), ledger)
    admit(KEYS_ENTRY.to_message(), ledger)
    assert ledger.held == {}


def test_knowledge_follows_the_ledger_like_a_model() -> None:
    ledger = OriginLedger()
    admit(knowledge(3), ledger)
    assert refusal(admit, knowledge(3), ledger) is Reason.NOT_NEWER
    assert refusal(admit, knowledge(2), ledger) is Reason.NOT_NEWER
    other = knowledge(3, logits=LOGITS + 1)  # same version, another payload
    assert refusal(admit, other, ledger) is Reason.EQUIVOCATION


def test_the_payload_is_what_the_layout_says() -> None:
    msg = knowledge()
    assert len(msg.payload) == 3 * 4 + 3 * 3 * 2  # int32 ids, float16 logits
    assert KS.frame_limit() > len(msg.to_wire()) - 4


# ------------------------------------------------------------------ kinds do not mix


def test_weight_entries_keep_their_bytes() -> None:
    body = body_dict(entry())
    assert not {"kind", "keys_sha256"} & set(body)
    assert EntryBody.from_bytes(entry().envelope.body).kind == WEIGHTS


def test_a_weight_node_refuses_typed_entries_and_a_knowledge_node_weights() -> None:
    assert refusal(admit_entry, knowledge(), **admit_kwargs()) is Reason.SCHEMA_MISMATCH
    assert refusal(admit, entry()) is Reason.SCHEMA_MISMATCH


def test_another_knowledge_schema_is_refused() -> None:
    wider = KnowledgeSchema(key_dim=8, num_classes=3, encoder="test-encoder", max_samples=8)
    assert refusal(admit, knowledge(), schema=wider) is Reason.SCHEMA_MISMATCH
    other = KnowledgeSchema(key_dim=4, num_classes=3, encoder="other", max_samples=8)
    assert refusal(admit, knowledge(), schema=other) is Reason.SCHEMA_MISMATCH
    # ... but max_samples is local, not part of the schema
    assert KnowledgeSchema(4, 3, "test-encoder", 100).id == KS.id


@pytest.mark.parametrize("change", [
    {"kind": "weights"},  # never spelled out: one encoding per body
    {"kind": "views"},  # unknown to this version
    {"kind": 7},
    {"kind": ["knowledge"]},
    {"keys_sha256": None},  # a knowledge body without its keys reference
    {"keys_sha256": b"\x00" * 31},
    {"extra": 1},
])
def test_malformed_typed_bodies(change: dict[str, Any]) -> None:
    body = {**body_dict(knowledge()), **change}
    body = {k: v for k, v in body.items() if v is not None}
    assert refusal(admit, forged(body, knowledge().payload)) is Reason.MALFORMED


def test_keys_body_must_not_name_a_keys_entry() -> None:
    body = {**body_dict(KEYS_ENTRY.to_message()), "keys_sha256": b"\x00" * 32}
    assert refusal(admit, forged(body, KEYS_ENTRY.to_message().payload)) is Reason.MALFORMED


# ------------------------------------------------------------------ hostile values


def test_too_many_rows_are_refused_before_the_payload_is_read() -> None:
    body = {**body_dict(knowledge()), "num_examples": KS.max_samples + 1}
    assert refusal(admit, forged(body, b"")) is Reason.TOO_LARGE
    body = {**body_dict(knowledge()), "num_examples": 0}
    assert refusal(admit, forged(body, b"")) is Reason.EXAMPLES_NONPOSITIVE


def test_signed_payload_length_must_match_the_rows() -> None:
    # The index must tile the signed length (checked while decoding the body) ...
    body = {**body_dict(knowledge()), "payload_len": 10**9}
    assert refusal(admit, forged(body, b"")) is Reason.PAYLOAD_MISMATCH
    # ... and a consistent index of more rows than the body says is over the layout
    big = know_raw([0, 1, 2, 3], np.zeros((4, 3)))
    body = {**body_dict(big), "num_examples": 3}
    assert refusal(admit, forged(body, big.payload)) is Reason.TOO_LARGE
    body = {**body_dict(knowledge()), "num_examples": 4}  # index covers 3 rows
    assert refusal(admit, forged(body, knowledge().payload)) is Reason.PAYLOAD_MISMATCH


def signed_raw(kind: str, tensors: dict[str, np.ndarray], **kw: Any) -> Entry:
    """Sign arrays as the origin would, bypassing sign_knowledge/sign_keys' own checks."""
    n = len(next(iter(tensors.values())))
    return sign_entry(ALICE, FLEET, version=5, created_at=NOW, schema_id=KS.id,
                      num_examples=n, tensors=tensors, kind=kind, **kw).to_message()


def know_raw(ids: Any, logits: Any) -> Entry:
    return signed_raw(KNOWLEDGE, {"ids": np.asarray(ids, "<i4"),
                                  "logits": np.asarray(logits, "<f2")},
                      keys_digest=KEYS_ENTRY.body.digest)


def keys_raw(keys: Any, labels: Any) -> Entry:
    return signed_raw(KEYS, {"keys": np.asarray(keys, "<f2"), "labels": np.asarray(labels, "<i2")})


@pytest.mark.parametrize(("ids", "reason"), [
    ([0, 2, 2], Reason.MALFORMED),  # repeated
    ([2, 0, 4], Reason.MALFORMED),  # not increasing
    ([-1, 0, 1], Reason.MALFORMED),
    ([0, 1, 8], Reason.TOO_LARGE),  # beyond max_samples
])
def test_bad_ids(ids: list[int], reason: Reason) -> None:
    assert refusal(admit, know_raw(ids, LOGITS)) is reason


@pytest.mark.parametrize(("value", "reason"), [
    (np.nan, Reason.NON_FINITE), (np.inf, Reason.NON_FINITE), (-np.inf, Reason.NON_FINITE),
    (MAX_LOGIT_ABS * 2, Reason.NORM_TOO_LARGE),
])
def test_bad_logits(value: float, reason: Reason) -> None:
    logits = LOGITS.copy()
    logits[1, 2] = value
    assert refusal(admit, know_raw(IDS, logits)) is reason


def test_bad_keys_and_labels() -> None:
    keys = unit_keys(3)
    assert refusal(admit, keys_raw(keys, [0, 3, 1])) is Reason.MALFORMED  # label >= C
    assert refusal(admit, keys_raw(keys, [0, -1, 1])) is Reason.MALFORMED
    assert refusal(admit, keys_raw(keys * 2, [0, 1, 1])) is Reason.NORM_TOO_LARGE
    zero = keys.copy()
    zero[0] = 0
    assert refusal(admit, keys_raw(zero, [0, 1, 1])) is Reason.NORM_TOO_LARGE
    nan = keys.copy()
    nan[2, 1] = np.nan
    assert refusal(admit, keys_raw(nan, [0, 1, 1])) is Reason.NON_FINITE


def test_wrong_dtype_or_shape_is_refused() -> None:
    wide = signed_raw(KNOWLEDGE, {"ids": IDS.astype("<i4"), "logits": LOGITS.astype("<f4")},
                      keys_digest=KEYS_ENTRY.body.digest)
    assert refusal(admit, wide) in (Reason.TOO_LARGE, Reason.DTYPE_MISMATCH)
    swapped = signed_raw(KEYS, {"keys": unit_keys(3, d=3).astype("<f2"),
                                "labels": np.zeros(3, "<i2")})
    assert refusal(admit, swapped) in (Reason.PAYLOAD_MISMATCH, Reason.SHAPE_MISMATCH)


def test_membership_and_impersonation_come_first() -> None:
    assert refusal(admit, knowledge(signer=MALLORY)) is Reason.NOT_MEMBER
    body = {**body_dict(knowledge(signer=BOB))}  # Bob signs a body naming Alice
    body["origin"] = body_dict(knowledge())["origin"]
    assert refusal(admit, forged(body, knowledge().payload, signer=BOB)) is Reason.BAD_SIGNATURE


def test_ids_beyond_the_keys_entry_do_not_join() -> None:
    keys = admit(KEYS_ENTRY.to_message()).tensors
    late = admit(know_raw([0, 1, 7], LOGITS)).tensors  # 7 < max_samples but >= 5 rows
    assert refusal(join_rows, keys, late) is Reason.PAYLOAD_MISMATCH


def test_signing_refuses_what_admission_would() -> None:
    with pytest.raises(ProtocolError):
        sign_knowledge(ALICE, FLEET, schema=KS, version=1, created_at=NOW, ids=np.array([1, 0, 2]),
                       logits=LOGITS, keys_digest=KEYS_ENTRY.body.digest)
    with pytest.raises(ValueError, match="key_dim"):
        sign_keys(ALICE, FLEET, schema=KS, version=1, created_at=NOW, keys=unit_keys(3, d=5),
                  labels=np.array([0, 1, 2]))


# ------------------------------------------------------------------ Digest items


def test_digest_items_carry_the_kind_only_when_typed() -> None:
    origin = body_dict(knowledge())["origin"]
    weights = DigestItem(origin, 1, NOW, b"\x01" * 32)
    typed = DigestItem(origin, 2, NOW, b"\x02" * 32, kind=KNOWLEDGE)
    raw = msgpack.unpackb(Digest((weights, typed)).head(), raw=False)
    assert raw["entries"][0] == [origin, 1, NOW, b"\x01" * 32]  # as before kinds existed
    assert raw["entries"][1] == [origin, 2, NOW, b"\x02" * 32, KNOWLEDGE]
    back = decode_frame(Digest((weights, typed)).to_wire()[4:])
    assert isinstance(back, Digest)
    assert back.entries == (weights, typed)


@pytest.mark.parametrize("fifth", ["weights", "views", 3, b"keys", None])
def test_digest_items_with_a_bad_kind_are_malformed(fifth: object) -> None:
    origin = body_dict(knowledge())["origin"]
    head = {"type": "digest", "v": 1, "entries": [[origin, 1, NOW, b"\x01" * 32, fifth]]}
    assert refusal(decode_frame, msgpack.packb(head, use_bin_type=True)) is Reason.MALFORMED
    head["entries"] = [[origin, 1, NOW, b"\x01" * 32, KEYS, KEYS]]  # over the item's bound
    assert refusal(decode_frame, msgpack.packb(head, use_bin_type=True)) is Reason.TOO_LARGE
    head["entries"] = [[origin, 1, NOW]]
    assert refusal(decode_frame, msgpack.packb(head, use_bin_type=True)) is Reason.MALFORMED


# ------------------------------------------------------------------ bit flips, invariant

FRAMES = {KNOWLEDGE: knowledge().to_wire(), KEYS: KEYS_ENTRY.to_message().to_wire()}


def pipeline(stream: bytes, *, chunk: int | None = None) -> int:
    """FrameDecoder -> decode_frame -> admit_typed, as a knowledge-mode daemon runs it."""
    dec = FrameDecoder(KS.frame_limit())
    frames = []
    step = chunk or max(len(stream), 1)
    for i in range(0, len(stream), step):
        frames += dec.feed(stream[i : i + step])
    dec.close()
    for frame in frames:
        message = decode_frame(frame)
        if isinstance(message, Entry):
            admit(message)
    return len(frames)


@pytest.mark.parametrize("kind", [KNOWLEDGE, KEYS])
def test_every_single_bit_flip_of_a_typed_frame_is_rejected(kind: str) -> None:
    frame = FRAMES[kind]
    assert pipeline(frame) == 1
    assert surviving_bit_flips(frame, pipeline) == []


def outcome(stream: bytes, chunk: int | None) -> object:
    try:
        return pipeline(stream, chunk=chunk)
    except ProtocolError as exc:
        return exc.reason


values = st.none() | st.booleans() | st.integers(-(2**64), 2**64 - 1) | st.floats() \
    | st.text(max_size=12) | st.binary(max_size=40) \
    | st.lists(st.integers(-5, 5) | st.text(max_size=5), max_size=4)
BODY_KEYS = ["kind", "keys_sha256", "num_examples", "payload_len", "schema_id", "tensors",
             "payload_sha256", "version", "created_at", "extra"]


@settings(max_examples=400, deadline=None)
@given(changes=st.dictionaries(st.sampled_from(BODY_KEYS), values, max_size=3),
       kind=st.sampled_from([KNOWLEDGE, KEYS]), drop=st.sampled_from([None, *BODY_KEYS]))
def test_decoder_invariant_for_signed_typed_bodies(
    changes: dict[str, object], kind: str, drop: str | None
) -> None:
    # Bodies the origin really signed reach every field check after the signature: any of
    # them yields an admitted entry or a ProtocolError, never another exception, and the
    # same answer whether the frame arrives whole or a byte at a time.
    base = knowledge() if kind == KNOWLEDGE else KEYS_ENTRY.to_message()
    body = {**body_dict(base), **changes}
    body.pop(drop or "", None)
    try:
        message = forged(body, base.payload)
    except (OverflowError, ValueError, TypeError):
        return  # not encodable as msgpack
    frame = message.to_wire()
    assert outcome(frame, None) == outcome(frame, 1)
    assert outcome(encode_frame(frame[4:]), None) == outcome(frame, 3)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.lists(values, max_size=6), max_size=3))
def test_decoder_invariant_for_digest_items(rows: list[list[object]]) -> None:
    head = {"type": "digest", "v": 1, "entries": rows}
    try:
        packed = msgpack.packb(head, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        return
    with contextlib.suppress(ProtocolError):
        decode_frame(packed)  # anything else escaping fails the test


def test_schema_id_is_stable() -> None:
    # Pinned: the id every node of a fleet computes must not drift between versions.
    expected = hashlib.sha256(b"peerd/knowledge-schema/v1\x004\n3\ntest-encoder\n").hexdigest()
    assert KS.id == expected


def test_a_keys_entry_naming_a_group_is_refused() -> None:
    # Issue 24 item 4b: keys entries carry no group (docs/protocol.md), yet one that named
    # one was admitted.
    signed = sign_entry(ALICE, FLEET, version=1, created_at=NOW - 10, schema_id=KS.id,
                        num_examples=5, tensors={"keys": unit_keys(5).astype("<f2"),
                                                 "labels": LABELS.astype("<i2")},
                        kind=KEYS, group="g1")
    assert signed.body.group == "g1"
    assert refusal(admit, signed.to_message()) is Reason.KEYS_GROUP
    assert admit(KEYS_ENTRY.to_message()).body.group is None  # without one: admitted
