"""Knowledge entries in both layouts a knowledge schema has, FedCache (logits for the rows of
a keys entry) and views (issue 17: per-sample vectors for ids of a fleet-wide shared index):
round trip and the ledger, the pinned schema id, another schema refused, malformed bodies,
hostile ids, values, shapes, dtypes and counts, membership before anything, every single-bit
flip of a signed frame and the decoder invariant, each over both layouts. Then what only
FedCache has: keys entries and their join, that weight entries and Digests keep their bytes,
Digest items with bad kinds. (What only views have: test_protocol_views.py.)"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
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
    sign_view,
)
from peerd.protocol.ledger import OriginLedger
from peerd.protocol.limits import MAX_LOGIT_ABS, MAX_VIEW_ABS
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
VS = KnowledgeSchema(key_dim=3, num_classes=10, encoder="test-views", max_samples=6,
                     view_ids=100)


def unit_keys(n: int, d: int = 4, seed: int = 0) -> npt.NDArray[np.float32]:
    x = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    out: npt.NDArray[np.float32] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


LABELS = np.array([0, 1, 2, 1, 0], dtype=np.int64)
KEYS_ENTRY = sign_keys(ALICE, FLEET, schema=KS, version=1, created_at=NOW - 10,
                       keys=unit_keys(5), labels=LABELS)
IDS = np.array([0, 2, 4], dtype=np.int32)
LOGITS = np.array([[1.5, -0.5, 0.0], [0.25, 2.0, -1.0], [3.0, 0.5, -2.5]], dtype=np.float32)
VIEW_IDS = np.array([3, 17, 99], dtype=np.int32)
VECTORS = np.array([[0.5, 0.0, 2.0], [1.25, 0.75, 0.0], [0.0, 8.0, 3.5]], dtype=np.float32)


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


# ------------------------------------------------------------------ the two layouts


@dataclass(frozen=True)
class Layout:
    """One layout of knowledge entries, and a valid entry of it (3 rows, version 2)."""

    name: str
    schema: KnowledgeSchema
    ids: npt.NDArray[np.int32]
    #: The per-row tensor: "logits" [m, classes] or "vectors" [m, key_dim].
    values_name: str
    values: npt.NDArray[np.float32]
    #: The largest |value| admitted.
    limit: float
    #: What the entry's keys_sha256 names: its keys entry, or (views) the schema itself.
    reference: str
    #: The bytes the schema id hashes.
    id_text: bytes

    def sign(self, version: int = 2, *, signer: Any = ALICE, ids: Any = None,
             values: Any = None) -> Entry:
        ids = self.ids if ids is None else ids
        values = self.values if values is None else values
        if self.values_name == "logits":
            return sign_knowledge(signer, FLEET, schema=self.schema, version=version,
                                  created_at=NOW, ids=ids, logits=values,
                                  keys_digest=self.reference).to_message()
        return sign_view(signer, FLEET, schema=self.schema, version=version, created_at=NOW,
                         ids=ids, vectors=values).to_message()

    def raw(self, ids: Any, values: Any, *, name: str | None = None,
            dtype: str = "<f2") -> Entry:
        """Arrays signed as the origin would, bypassing the signing functions' checks."""
        t = {"ids": np.asarray(ids, "<i4"), name or self.values_name: np.asarray(values, dtype)}
        return sign_entry(ALICE, FLEET, version=5, created_at=NOW, schema_id=self.schema.id,
                          num_examples=len(t["ids"]), tensors=t, kind=KNOWLEDGE,
                          keys_digest=self.reference).to_message()

    def admit(self, message: Entry, ledger: OriginLedger | None = None, **kw: Any) -> Any:
        return admit_typed(message, **{**admit_kwargs(ledger), "schema": self.schema, **kw})

    def other(self, **change: Any) -> KnowledgeSchema:
        """This schema with one setting changed."""
        s = self.schema
        args = {"key_dim": s.key_dim, "num_classes": s.num_classes, "encoder": s.encoder,
                "max_samples": s.max_samples, "view_ids": s.view_ids, **change}
        return KnowledgeSchema(**args)


FEDCACHE = Layout("fedcache", KS, IDS, "logits", LOGITS, MAX_LOGIT_ABS, KEYS_ENTRY.body.digest,
                  b"peerd/knowledge-schema/v1\x004\n3\ntest-encoder\n")
VIEWS = Layout("views", VS, VIEW_IDS, "vectors", VECTORS, MAX_VIEW_ABS, VS.id,
               b"peerd/knowledge-schema/v1\x003\n10\ntest-views\nviews\n100\n")
BOTH = [pytest.param(FEDCACHE, id="fedcache"), pytest.param(VIEWS, id="views")]


def knowledge(version: int = 2, **kw: Any) -> Entry:
    return FEDCACHE.sign(version, **kw)


def admit(message: Entry, ledger: OriginLedger | None = None, **kw: Any) -> Any:
    return FEDCACHE.admit(message, ledger, **kw)


@pytest.mark.parametrize("layout", BOTH)
def test_an_entry_round_trips_and_follows_the_ledger(layout: Layout) -> None:
    ledger = OriginLedger()
    got = layout.admit(layout.sign(), ledger)
    assert (got.body.kind, got.body.keys_digest, got.body.num_examples) == (
        KNOWLEDGE, layout.reference, 3)
    assert got.tensors["ids"].tolist() == layout.ids.tolist()
    np.testing.assert_array_equal(got.tensors[layout.values_name], layout.values)  # exact f16
    assert len(layout.sign().payload) == 3 * 4 + 3 * 3 * 2  # int32 ids, float16 values
    assert layout.schema.frame_limit() > len(layout.sign().to_wire()) - 4
    assert ledger.held[got.body.origin].version == 2  # recorded like a model's version
    assert refusal(layout.admit, layout.sign(2), ledger) is Reason.NOT_NEWER
    assert refusal(layout.admit, layout.sign(1), ledger) is Reason.NOT_NEWER
    assert layout.admit(layout.sign(3), ledger).body.version == 3
    other = layout.sign(3, values=layout.values + 1)  # same version, another payload
    assert refusal(layout.admit, other, ledger) is Reason.EQUIVOCATION


@pytest.mark.parametrize("layout", BOTH)
def test_the_schema_id_is_pinned_and_another_schema_is_refused(layout: Layout) -> None:
    # Pinned: the id every node of a fleet computes must not drift between versions.
    assert layout.schema.id == hashlib.sha256(layout.id_text).hexdigest()
    assert layout.other(max_samples=100).id == layout.schema.id  # local, not the schema's
    for change in ({"key_dim": 8}, {"encoder": "other"}):
        assert refusal(layout.admit, layout.sign(), schema=layout.other(**change)) is \
            Reason.SCHEMA_MISMATCH


@pytest.mark.parametrize("layout", BOTH)
@pytest.mark.parametrize("change", [
    {"kind": "weights"},  # never spelled out: one encoding per body
    {"kind": "views"},  # no such kind (a view is a knowledge entry)
    {"kind": 7},
    {"kind": ""},  # a string outside the bounds of any kind's name
    {"kind": ["knowledge"]},
    {"keys_sha256": None},  # a knowledge body without its reference
    {"keys_sha256": b"\x00" * 31},
    {"vectors": 1},  # unknown body keys
    {"extra": 1},
])
def test_malformed_bodies(layout: Layout, change: dict[str, Any]) -> None:
    body = {**body_dict(layout.sign()), **change}
    body = {k: v for k, v in body.items() if v is not None}
    assert refusal(layout.admit, forged(body, layout.sign().payload)) is Reason.MALFORMED


@pytest.mark.parametrize("layout", BOTH)
@pytest.mark.parametrize(("ids", "reason"), [
    (lambda a, b, c, beyond: [a, b, b], Reason.MALFORMED),  # repeated
    (lambda a, b, c, beyond: [b, a, c], Reason.MALFORMED),  # not increasing
    (lambda a, b, c, beyond: [-1, a, b], Reason.MALFORMED),
    (lambda a, b, c, beyond: [a, b, beyond], Reason.TOO_LARGE),  # beyond the rows / index
    (lambda a, b, c, beyond: [a, b, 2**31 - 1], Reason.TOO_LARGE),
])
def test_bad_ids(layout: Layout, ids: Any, reason: Reason) -> None:
    beyond = layout.schema.view_ids or layout.schema.max_samples
    bad = ids(*layout.ids.tolist(), beyond)
    assert refusal(layout.admit, layout.raw(bad, layout.values)) is reason
    with pytest.raises(ProtocolError):  # signing refuses what admission would
        layout.sign(ids=np.array(bad))


@pytest.mark.parametrize("layout", BOTH)
@pytest.mark.parametrize(("value", "reason"), [
    (np.nan, Reason.NON_FINITE), (np.inf, Reason.NON_FINITE), (-np.inf, Reason.NON_FINITE),
    (2.0, Reason.NORM_TOO_LARGE), (-2.0, Reason.NORM_TOO_LARGE),  # times the limit
])
def test_bad_values(layout: Layout, value: float, reason: Reason) -> None:
    values = layout.values.copy()
    values[1, 2] = value * layout.limit if np.isfinite(value) else value
    assert refusal(layout.admit, layout.raw(layout.ids, values)) is reason


@pytest.mark.parametrize("layout", BOTH)
def test_wrong_shapes_dtypes_and_names_are_refused(layout: Layout) -> None:
    rows, cols = layout.values.shape
    wide = layout.raw(layout.ids, np.zeros((rows, cols + 1)))
    assert refusal(layout.admit, wide) in (Reason.TOO_LARGE, Reason.SHAPE_MISMATCH)
    short = layout.raw(layout.ids, np.zeros((rows, cols - 1)))
    assert refusal(layout.admit, short) in (Reason.PAYLOAD_MISMATCH, Reason.SHAPE_MISMATCH)
    f32 = layout.raw(layout.ids, layout.values, dtype="<f4")
    assert refusal(layout.admit, f32) in (Reason.TOO_LARGE, Reason.DTYPE_MISMATCH)
    other = "vectors" if layout.values_name == "logits" else "logits"
    assert refusal(layout.admit, layout.raw(layout.ids, layout.values, name=other)) is \
        Reason.SHAPE_MISMATCH


@pytest.mark.parametrize("layout", BOTH)
def test_counts_are_refused_before_the_payload_is_read(layout: Layout) -> None:
    def with_body(payload: bytes | bytearray | memoryview, **change: Any) -> Reason:
        return refusal(layout.admit, forged({**body_dict(layout.sign()), **change}, payload))

    assert with_body(b"", num_examples=layout.schema.max_samples + 1) is Reason.TOO_LARGE
    assert with_body(b"", num_examples=0) is Reason.EXAMPLES_NONPOSITIVE
    # The index must tile the signed length (checked while decoding the body) ...
    assert with_body(b"", payload_len=10**9) is Reason.PAYLOAD_MISMATCH
    # ... an index of more rows than the body says is over the layout, of fewer does not
    # tile it.
    payload = layout.sign().payload
    assert with_body(payload, num_examples=2) is Reason.TOO_LARGE
    assert with_body(payload, num_examples=4) is Reason.PAYLOAD_MISMATCH


@pytest.mark.parametrize("layout", BOTH)
def test_membership_and_impersonation_come_first(layout: Layout) -> None:
    assert refusal(layout.admit, layout.sign(signer=MALLORY)) is Reason.NOT_MEMBER
    body = body_dict(layout.sign(signer=BOB))  # Bob signs a body naming Alice
    body["origin"] = body_dict(layout.sign())["origin"]
    assert refusal(layout.admit, forged(body, layout.sign().payload, signer=BOB)) is \
        Reason.BAD_SIGNATURE


# ------------------------------------------------------------------ bit flips, invariant


def pipeline(layout: Layout, stream: bytes, *, chunk: int | None = None) -> int:
    """FrameDecoder -> decode_frame -> admit_typed, as a knowledge-mode daemon runs it."""
    dec = FrameDecoder(layout.schema.frame_limit())
    frames = []
    step = chunk or max(len(stream), 1)
    for i in range(0, len(stream), step):
        frames += dec.feed(stream[i : i + step])
    dec.close()
    for frame in frames:
        message = decode_frame(frame)
        if isinstance(message, Entry):
            layout.admit(message)
    return len(frames)


#: Every typed frame a knowledge node admits: a FedCache node's knowledge and keys, a view.
FRAMES = [pytest.param(FEDCACHE, knowledge(), id="knowledge"),
          pytest.param(FEDCACHE, KEYS_ENTRY.to_message(), id="keys"),
          pytest.param(VIEWS, VIEWS.sign(), id="view")]


@pytest.mark.parametrize(("layout", "message"), FRAMES)
def test_every_single_bit_flip_of_a_typed_frame_is_rejected(layout: Layout,
                                                            message: Entry) -> None:
    frame = message.to_wire()
    assert pipeline(layout, frame) == 1
    assert surviving_bit_flips(frame, lambda s: pipeline(layout, s)) == []


def outcome(layout: Layout, stream: bytes, chunk: int | None) -> object:
    try:
        return pipeline(layout, stream, chunk=chunk)
    except ProtocolError as exc:
        return exc.reason


values = st.none() | st.booleans() | st.integers(-(2**64), 2**64 - 1) | st.floats() \
    | st.text(max_size=12) | st.binary(max_size=40) \
    | st.lists(st.integers(-5, 5) | st.text(max_size=5), max_size=4)
BODY_KEYS = ["kind", "keys_sha256", "num_examples", "payload_len", "schema_id", "tensors",
             "payload_sha256", "version", "created_at", "extra", "vectors"]


@pytest.mark.parametrize(("layout", "base"), FRAMES)
@settings(max_examples=300, deadline=None)
@given(changes=st.dictionaries(st.sampled_from(BODY_KEYS), values, max_size=3),
       drop=st.sampled_from([None, *BODY_KEYS]), payload=st.none() | st.binary(max_size=60))
def test_decoder_invariant_for_signed_typed_bodies(
    layout: Layout, base: Entry, changes: dict[str, object], drop: str | None,
    payload: bytes | None,
) -> None:
    # Bodies the origin really signed (and any payload beside them) reach every field check
    # after the signature: any of them yields an admitted entry or a ProtocolError, never
    # another exception, and the same answer whether the frame arrives whole or in chunks.
    body = {**body_dict(base), **changes}
    body.pop(drop or "", None)
    try:
        message = forged(body, base.payload if payload is None else payload)
    except (OverflowError, ValueError, TypeError):
        return  # not encodable as msgpack
    frame = message.to_wire()
    assert outcome(layout, frame, None) == outcome(layout, frame, 1)
    assert outcome(layout, encode_frame(frame[4:]), None) == outcome(layout, frame, 3)


# ------------------------------------------------------------------ FedCache: keys entries


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


def test_keys_entries_are_content_addressed_not_versioned() -> None:
    # Knowledge is recorded in the ledger; keys are not: the same keys entry twice is fine
    # (used by reference, not by version)
    ledger = OriginLedger()
    admit(KEYS_ENTRY.to_message(), ledger)
    admit(KEYS_ENTRY.to_message(), ledger)
    assert ledger.held == {}


def test_keys_body_must_not_name_a_keys_entry() -> None:
    body = {**body_dict(KEYS_ENTRY.to_message()), "keys_sha256": b"\x00" * 32}
    assert refusal(admit, forged(body, KEYS_ENTRY.to_message().payload)) is Reason.MALFORMED


def signed_raw(kind: str, tensors: dict[str, np.ndarray], **kw: Any) -> Entry:
    """Sign arrays as the origin would, bypassing sign_knowledge/sign_keys' own checks."""
    n = len(next(iter(tensors.values())))
    return sign_entry(ALICE, FLEET, version=5, created_at=NOW, schema_id=KS.id,
                      num_examples=n, tensors=tensors, kind=kind, **kw).to_message()


def keys_raw(keys: Any, labels: Any) -> Entry:
    return signed_raw(KEYS, {"keys": np.asarray(keys, "<f2"), "labels": np.asarray(labels, "<i2")})


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
    swapped = signed_raw(KEYS, {"keys": unit_keys(3, d=3).astype("<f2"),
                                "labels": np.zeros(3, "<i2")})
    assert refusal(admit, swapped) in (Reason.PAYLOAD_MISMATCH, Reason.SHAPE_MISMATCH)
    with pytest.raises(ValueError, match="key_dim"):
        sign_keys(ALICE, FLEET, schema=KS, version=1, created_at=NOW, keys=unit_keys(3, d=5),
                  labels=np.array([0, 1, 2]))


def test_ids_beyond_the_keys_entry_do_not_join() -> None:
    keys = admit(KEYS_ENTRY.to_message()).tensors
    late = admit(FEDCACHE.raw([0, 1, 7], LOGITS)).tensors  # 7 < max_samples but >= 5 rows
    assert refusal(join_rows, keys, late) is Reason.PAYLOAD_MISMATCH


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


# ------------------------------------------------------------------ weights keep their bytes


def test_weight_entries_keep_their_bytes() -> None:
    body = body_dict(entry())
    assert not {"kind", "keys_sha256"} & set(body)
    assert EntryBody.from_bytes(entry().envelope.body).kind == WEIGHTS


def test_a_weight_node_refuses_typed_entries_and_a_knowledge_node_weights() -> None:
    assert refusal(admit_entry, knowledge(), **admit_kwargs()) is Reason.SCHEMA_MISMATCH
    assert refusal(admit, entry()) is Reason.SCHEMA_MISMATCH


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


@pytest.mark.parametrize("fifth", ["weights", "views", "", 3, b"keys", None])
def test_digest_items_with_a_bad_kind_are_malformed(fifth: object) -> None:
    origin = body_dict(knowledge())["origin"]
    head = {"type": "digest", "v": 1, "entries": [[origin, 1, NOW, b"\x01" * 32, fifth]]}
    assert refusal(decode_frame, msgpack.packb(head, use_bin_type=True)) is Reason.MALFORMED
    head["entries"] = [[origin, 1, NOW, b"\x01" * 32, KEYS, KEYS]]  # over the item's bound
    assert refusal(decode_frame, msgpack.packb(head, use_bin_type=True)) is Reason.TOO_LARGE
    head["entries"] = [[origin, 1, NOW]]
    assert refusal(decode_frame, msgpack.packb(head, use_bin_type=True)) is Reason.MALFORMED


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
