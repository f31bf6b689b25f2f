"""View entries (issue 17): knowledge entries under a view schema carrying per-sample vectors
for ids of a fleet-wide shared index. Round trip, the schema boundary in both directions,
hostile values and counts, every bit flip of a signed view frame, the decoder invariant."""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.reasons import Reason
from peerd.protocol.entry import sign_entry
from peerd.protocol.envelope import ENTRY_DOMAIN, SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.frames import FrameDecoder, encode_frame
from peerd.protocol.kinds import KEYS, KNOWLEDGE
from peerd.protocol.knowledge import (
    KnowledgeSchema,
    admit_typed,
    sign_keys,
    sign_knowledge,
    sign_view,
)
from peerd.protocol.ledger import OriginLedger
from peerd.protocol.limits import MAX_VIEW_ABS, MAX_VIEW_IDS
from peerd.protocol.messages import Entry, decode_frame
from peerd.protocol.wire import pack
from tests.protocol.helpers import (
    ALICE,
    BOB,
    FLEET,
    MALLORY,
    NOW,
    admit_kwargs,
    surviving_bit_flips,
)

VS = KnowledgeSchema(key_dim=3, num_classes=10, encoder="test-views", max_samples=6,
                     view_ids=100)
FEDCACHE = KnowledgeSchema(key_dim=3, num_classes=10, encoder="test-views", max_samples=6)
IDS = np.array([3, 17, 99], dtype=np.int32)
VECTORS = np.array([[0.5, 0.0, 2.0], [1.25, 0.75, 0.0], [0.0, 8.0, 3.5]], dtype=np.float32)


def view(version: int = 2, *, signer: Any = ALICE, ids: Any = IDS, vectors: Any = VECTORS,
         schema: KnowledgeSchema = VS) -> Entry:
    return sign_view(signer, FLEET, schema=schema, version=version, created_at=NOW, ids=ids,
                     vectors=vectors).to_message()


def admit(message: Entry, ledger: OriginLedger | None = None, **kw: Any) -> Any:
    return admit_typed(message, **{**admit_kwargs(ledger), "schema": VS, **kw})


def refusal(fn: Any, *args: Any, **kw: Any) -> Reason:
    with pytest.raises(ProtocolError) as info:
        fn(*args, **kw)
    return info.value.reason


def body_dict(message: Entry) -> dict[str, Any]:
    out: dict[str, Any] = msgpack.unpackb(message.envelope.body, raw=False)
    return out


def forged(body: dict[str, Any], payload: bytes | bytearray | memoryview = b"",
           signer: Any = ALICE) -> Entry:
    """An entry whose body the origin really signed, whatever it says."""
    return Entry(SignedEnvelope.sign(signer, ENTRY_DOMAIN, FLEET, pack(body)), payload)


def raw_view(ids: Any, vectors: Any, *, n: int | None = None, keys_digest: str = VS.id) -> Entry:
    """Arrays signed as the origin would, bypassing sign_view's own checks."""
    t = {"ids": np.asarray(ids, "<i4"), "vectors": np.asarray(vectors, "<f2")}
    return sign_entry(ALICE, FLEET, version=5, created_at=NOW, schema_id=VS.id,
                      num_examples=len(t["ids"]) if n is None else n, tensors=t,
                      kind=KNOWLEDGE, keys_digest=keys_digest).to_message()


# ------------------------------------------------------------------ round trip


def test_a_view_round_trips_and_follows_the_ledger() -> None:
    ledger = OriginLedger()
    v = admit(view(), ledger)
    assert (v.body.kind, v.body.keys_digest, v.body.num_examples) == (KNOWLEDGE, VS.id, 3)
    assert v.tensors["ids"].tolist() == IDS.tolist()
    np.testing.assert_array_equal(v.tensors["vectors"], VECTORS)  # exact in float16
    assert len(view().payload) == 3 * 4 + 3 * 3 * 2  # int32 ids, float16 vectors
    assert ledger.held[v.body.origin].version == 2
    assert refusal(admit, view(2), ledger) is Reason.NOT_NEWER
    assert admit(view(3), ledger).body.version == 3
    assert refusal(admit, view(3, vectors=VECTORS + 1), ledger) is Reason.EQUIVOCATION


def test_the_view_schema_id_is_pinned_and_fedcache_ids_are_unchanged() -> None:
    base = b"peerd/knowledge-schema/v1\x003\n10\ntest-views\n"
    assert FEDCACHE.id == hashlib.sha256(base).hexdigest()
    assert VS.id == hashlib.sha256(base + b"views\n100\n").hexdigest()
    assert KnowledgeSchema(3, 10, "test-views", 6, view_ids=101).id != VS.id
    assert VS.frame_limit() < FEDCACHE.frame_limit()  # no keys entry to allow for


# ------------------------------------------------------------------ one kind, two layouts


def test_view_and_fedcache_nodes_refuse_each_other() -> None:
    keys = sign_keys(ALICE, FLEET, schema=FEDCACHE, version=1, created_at=NOW,
                     keys=np.eye(2, 3, dtype=np.float32), labels=np.array([0, 1]))
    logits = sign_knowledge(ALICE, FLEET, schema=FEDCACHE, version=2, created_at=NOW,
                            ids=np.array([0, 1]), logits=np.zeros((2, 10)),
                            keys_digest=keys.body.digest)
    assert refusal(admit, keys.to_message()) is Reason.SCHEMA_MISMATCH
    assert refusal(admit, logits.to_message()) is Reason.SCHEMA_MISMATCH
    assert refusal(admit, view(), schema=FEDCACHE) is Reason.SCHEMA_MISMATCH


def test_a_view_must_name_its_schema_as_its_reference() -> None:
    assert refusal(admit, raw_view(IDS, VECTORS, keys_digest="ab" * 32)) is \
        Reason.SCHEMA_MISMATCH
    body = {**body_dict(view()), "kind": KEYS}
    body.pop("keys_sha256")
    assert refusal(admit, forged(body, view().payload)) is Reason.SCHEMA_MISMATCH


@pytest.mark.parametrize("change", [
    {"kind": "views"},  # no such kind: a view is a knowledge entry
    {"keys_sha256": None},
    {"keys_sha256": b"\x00" * 31},
    {"vectors": 1},  # unknown keys
    {"extra": 1},
])
def test_malformed_view_bodies(change: dict[str, Any]) -> None:
    body = {**body_dict(view()), **change}
    body = {k: v for k, v in body.items() if v is not None}
    assert refusal(admit, forged(body, view().payload)) is Reason.MALFORMED


# ------------------------------------------------------------------ hostile values


@pytest.mark.parametrize(("ids", "reason"), [
    ([3, 17, 17], Reason.MALFORMED),  # duplicate
    ([17, 3, 99], Reason.MALFORMED),  # unsorted
    ([-1, 3, 17], Reason.MALFORMED),
    ([3, 17, 100], Reason.TOO_LARGE),  # beyond the shared index
    ([3, 17, 2**31 - 1], Reason.TOO_LARGE),
])
def test_bad_ids(ids: list[int], reason: Reason) -> None:
    assert refusal(admit, raw_view(ids, VECTORS)) is reason


@pytest.mark.parametrize(("value", "reason"), [
    (np.nan, Reason.NON_FINITE), (np.inf, Reason.NON_FINITE), (-np.inf, Reason.NON_FINITE),
    (MAX_VIEW_ABS * 2, Reason.NORM_TOO_LARGE), (-MAX_VIEW_ABS * 2, Reason.NORM_TOO_LARGE),
])
def test_bad_vectors(value: float, reason: Reason) -> None:
    vectors = VECTORS.copy()
    vectors[2, 1] = value
    assert refusal(admit, raw_view(IDS, vectors)) is reason


def test_wrong_shapes_and_dtypes_are_refused() -> None:
    wide = raw_view(IDS, np.zeros((3, 4)))  # vectors one column too wide
    assert refusal(admit, wide) in (Reason.TOO_LARGE, Reason.SHAPE_MISMATCH)
    short = raw_view(IDS, np.zeros((3, 2)))
    assert refusal(admit, short) in (Reason.PAYLOAD_MISMATCH, Reason.SHAPE_MISMATCH)
    f32 = sign_entry(ALICE, FLEET, version=5, created_at=NOW, schema_id=VS.id, num_examples=3,
                     tensors={"ids": IDS, "vectors": VECTORS.astype("<f4")}, kind=KNOWLEDGE,
                     keys_digest=VS.id).to_message()
    assert refusal(admit, f32) in (Reason.TOO_LARGE, Reason.DTYPE_MISMATCH)
    logits_named = sign_entry(ALICE, FLEET, version=5, created_at=NOW, schema_id=VS.id,
                              num_examples=3, tensors={"ids": IDS, "logits": VECTORS.astype(
                                  "<f2")}, kind=KNOWLEDGE, keys_digest=VS.id).to_message()
    assert refusal(admit, logits_named) is Reason.SHAPE_MISMATCH


def test_counts_are_refused_before_the_payload_is_read() -> None:
    body = {**body_dict(view()), "num_examples": VS.max_samples + 1}
    assert refusal(admit, forged(body, b"")) is Reason.TOO_LARGE
    body = {**body_dict(view()), "num_examples": 0}
    assert refusal(admit, forged(body, b"")) is Reason.EXAMPLES_NONPOSITIVE
    body = {**body_dict(view()), "num_examples": 2}  # the index covers 3 rows
    assert refusal(admit, forged(body, view().payload)) is Reason.TOO_LARGE
    body = {**body_dict(view()), "payload_len": 10**9}
    assert refusal(admit, forged(body, b"")) is Reason.PAYLOAD_MISMATCH


def test_membership_and_impersonation_come_first() -> None:
    assert refusal(admit, view(signer=MALLORY)) is Reason.NOT_MEMBER
    body = body_dict(view(signer=BOB))
    body["origin"] = body_dict(view())["origin"]
    assert refusal(admit, forged(body, view().payload, signer=BOB)) is Reason.BAD_SIGNATURE


def test_signing_and_the_schema_refuse_what_admission_would() -> None:
    with pytest.raises(ProtocolError):
        view(ids=np.array([17, 3, 99]))
    with pytest.raises(ProtocolError):
        view(ids=np.array([3, 17, 100]))
    with pytest.raises(ValueError, match="vectors"):
        view(vectors=np.zeros((3, 4)))
    with pytest.raises(ValueError, match="view schema"):
        view(schema=FEDCACHE)
    with pytest.raises(ValueError, match="view_ids"):
        KnowledgeSchema(3, 10, "x", view_ids=MAX_VIEW_IDS + 1)
    with pytest.raises(ValueError, match="no keys"):
        VS.layout(KEYS, 1)


# ------------------------------------------------------------------ bit flips, invariant


def pipeline(stream: bytes, *, chunk: int | None = None) -> int:
    """FrameDecoder -> decode_frame -> admit_typed, as a view-mode daemon runs it."""
    dec = FrameDecoder(VS.frame_limit())
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


def test_every_single_bit_flip_of_a_view_frame_is_rejected() -> None:
    frame = view().to_wire()
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
             "payload_sha256", "version", "created_at", "extra", "vectors"]


@settings(max_examples=400, deadline=None)
@given(changes=st.dictionaries(st.sampled_from(BODY_KEYS), values, max_size=3),
       drop=st.sampled_from([None, *BODY_KEYS]), payload=st.none() | st.binary(max_size=60))
def test_decoder_invariant_for_signed_view_bodies(
    changes: dict[str, object], drop: str | None, payload: bytes | None
) -> None:
    # Any body the origin really signed (and any payload beside it) yields an admitted view
    # or a ProtocolError, never another exception, whole or split into any chunks.
    base = view()
    body = {**body_dict(base), **changes}
    body.pop(drop or "", None)
    try:
        message = forged(body, base.payload if payload is None else payload)
    except (OverflowError, ValueError, TypeError):
        return  # not encodable as msgpack
    frame = message.to_wire()
    assert outcome(frame, None) == outcome(frame, 1)
    assert outcome(encode_frame(frame[4:]), None) == outcome(frame, 3)


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=6),
       cells=st.lists(st.floats(width=16), min_size=18, max_size=18))
def test_decoder_invariant_for_view_payload_values(ids: list[int], cells: list[float]) -> None:
    # Whatever ids and vectors are signed, admission answers with a view whose ids are
    # strictly increasing inside the index and whose vectors are finite and bounded, or a
    # ProtocolError.
    vectors = np.array(cells[: 3 * len(ids)], dtype=np.float32).reshape(len(ids), 3)
    try:
        v = admit(raw_view(ids, vectors))
    except ProtocolError:
        return
    got = v.tensors["ids"].astype(np.int64)
    assert got[0] >= 0
    assert got[-1] < VS.view_ids
    assert bool(np.all(np.diff(got) > 0))
    vec = v.tensors["vectors"].astype(np.float32)
    assert bool(np.isfinite(vec).all())
    assert float(np.abs(vec).max()) <= MAX_VIEW_ABS
