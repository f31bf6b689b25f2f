"""Compact encodings of weight entries (issue 27, item 5): the origin's codec is signed with
the bytes it produced, a receiver decodes to float32 within the codec's error bound, and
hostile indexes and payloads are refused by name before a value is used."""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.reasons import Reason
from peerd.protocol.admission import admit_entry, entry_frame_limit
from peerd.protocol.encoding import RAW, Encoding, decode_array, encode_array, encoded_nbytes
from peerd.protocol.entry import EntryBody, sign_entry
from peerd.protocol.envelope import ENTRY_DOMAIN, SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.frames import FrameDecoder
from peerd.protocol.ledger import OriginLedger
from peerd.protocol.limits import MAX_INT8_BLOCK, MAX_INT8_SCALE, MIN_INT8_BLOCK
from peerd.protocol.messages import Entry, decode_frame
from peerd.protocol.tensors import (
    TensorIndexItem,
    decode_tensors,
    encode_tensors,
    index_from_wire,
    schema_payload_len,
)
from tests.protocol.helpers import (
    ALICE,
    FLEET,
    NOW,
    SCHEMA,
    SCHEMA_ID,
    admit_kwargs,
    surviving_bit_flips,
)

ENCODINGS = ["float16", "bfloat16", "int8", "int8:16", "int8:256"]


def model(seed: int = 0) -> dict[str, npt.NDArray[Any]]:
    rng = np.random.default_rng(seed)
    return {
        "fc.weight": rng.standard_normal((3, 4)).astype(np.float32),
        "fc.bias": rng.standard_normal(3).astype(np.float32),
        "bn.num_batches_tracked": np.array(7, dtype=np.int64),
    }


def signed(arrays: dict[str, npt.NDArray[Any]], encoding: Encoding) -> Entry:
    return sign_entry(ALICE, FLEET, version=1, created_at=NOW, schema_id=SCHEMA_ID,
                      num_examples=10, tensors=arrays, encoding=encoding).to_message()


def bound(codec: str, block: int, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """Per value, the largest error the codec may make on ``x``."""
    a = np.abs(x.astype(np.float64)).reshape(-1)
    if codec == "float16":
        return np.maximum(a * 2.0**-11, 2.0**-25)  # half an ulp; subnormals below 2**-14
    if codec == "bfloat16":
        return a * 2.0**-8 + 2.0**-134  # half an ulp; bfloat16's subnormals are float32's
    size = a.size if block == 0 else block
    out = np.empty_like(a)
    for lo in range(0, a.size, size):
        out[lo : lo + size] = a[lo : lo + size].max() / 127 / 2 * (1 + 1e-5)
    return out


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(ENCODINGS),
       st.lists(st.floats(-1e4, 1e4, width=32), min_size=2, max_size=300),
       st.floats(1e-6, 1e3))
def test_every_codec_round_trips_within_its_error_bound(name: str, values: list[float],
                                                        scale: float) -> None:
    enc = Encoding.parse(name)
    x = (np.array(values, dtype=np.float32) * np.float32(scale)).astype(np.float32)
    data = encode_array(x, enc)
    if data is None:  # carried raw: int8 that cannot shrink it, or beyond float16's range
        tiny = np.finfo(np.float32).tiny * 127  # a block peak int8 cannot scale finely
        assert ((enc.codec == "int8" and (encoded_nbytes("int8", enc.block, x.size) > 4 * x.size
                                           or np.abs(x)[np.abs(x) < tiny].max(initial=0) > 0))
                or (enc.codec == "float16" and np.abs(x).max() >= 65520))
        return
    assert enc.codec is not None
    assert len(data) == encoded_nbytes(enc.codec, enc.block, x.size) <= 4 * x.size
    y = decode_array(enc.codec, enc.block, x.shape, memoryview(data), "t")
    assert y.dtype == np.float32
    assert not y.flags.writeable
    err = np.abs(y.astype(np.float64) - x.astype(np.float64))
    assert (err <= bound(enc.codec, enc.block, x)).all()


def test_int8_carries_a_block_too_small_to_scale_raw() -> None:
    # Hypothesis found it: the scale of a peak of 1.7e-44 underflows to 0 and decoded 0.
    x = np.array([0.0, 1.6830178898000676e-44], dtype=np.float32)
    assert encode_array(x, Encoding("int8")) is None
    assert encode_array(x * np.float32(1e10), Encoding("int8")) is not None


def test_bfloat16_rounds_to_nearest_even_not_by_truncation() -> None:
    x = np.array([1 + 2**-8 + 2**-12, 1 + 2**-8, 1 + 3 * 2**-8], dtype=np.float32)
    y = decode_array("bfloat16", 0, x.shape, memoryview(encode_array(x, Encoding("bfloat16"))
                                                        or b""), "t")
    # Above the half: up; exactly half: to the even neighbour (1.0, then 1 + 2**-6).
    assert y.tolist() == [1 + 2**-7, 1.0, 1 + 2**-6]


def test_int8_per_block_scales_are_the_block_maxima_over_127() -> None:
    x = np.concatenate([np.full(16, 0.5), np.full(16, -254.0), np.zeros(4)]).astype(np.float32)
    data = encode_array(x, Encoding("int8", 16))
    assert data is not None
    assert len(data) == 3 * 4 + 36
    scales = np.frombuffer(data[:12], dtype="<f4")
    assert scales.tolist() == [np.float32(0.5 / 127), 2.0, 0.0]
    q = np.frombuffer(data[12:], dtype=np.int8)
    assert q.tolist() == [127] * 16 + [-127] * 16 + [0] * 4


def test_float32_is_the_bytes_of_before() -> None:
    arrays = model()
    index, payload = encode_tensors(arrays)
    index_raw, payload_raw = encode_tensors(arrays, encoding=RAW)
    assert (index, bytes(payload)) == (index_raw, bytes(payload_raw))
    assert all(len(item.to_wire()) == 4 for item in index)
    assert signed(arrays, RAW).envelope.body == sign_entry(
        ALICE, FLEET, version=1, created_at=NOW, schema_id=SCHEMA_ID, num_examples=10,
        tensors=arrays).to_message().envelope.body


@pytest.mark.parametrize("name", ENCODINGS)
def test_integer_buffers_and_other_dtypes_are_never_encoded(name: str) -> None:
    arrays = {**model(), "h": np.ones(64, dtype=np.float16), "d": np.ones(64, dtype=np.float64)}
    index, payload = encode_tensors(arrays, encoding=Encoding.parse(name))
    codecs = {item.name: item.codec for item in index}
    assert codecs["bn.num_batches_tracked"] is None
    assert codecs["h"] is None
    assert codecs["d"] is None
    decoded = decode_tensors(index, payload)
    assert decoded["bn.num_batches_tracked"].dtype == np.int64
    assert int(decoded["bn.num_batches_tracked"]) == 7


def test_values_a_codec_cannot_hold_travel_raw() -> None:
    big = np.array([1.0, 7e4], dtype=np.float32)  # above float16's 65504
    assert encode_array(big, Encoding("float16")) is None
    assert encode_array(big, Encoding("bfloat16")) is not None
    huge = np.array([1.0, 3.4e38], dtype=np.float32)  # rounds to bfloat16's Inf
    assert encode_array(huge, Encoding("bfloat16")) is None
    nan = np.array([1.0, np.nan], dtype=np.float32)
    for name in ENCODINGS:
        assert encode_array(nan, Encoding.parse(name)) is None  # refused as non_finite later
    one = np.ones(1, dtype=np.float32)
    assert encode_array(one, Encoding("int8")) is None  # 4 + 1 bytes > 4
    assert encode_array(one, Encoding("float16")) is not None


@pytest.mark.parametrize("name", ENCODINGS)
def test_an_encoded_entry_is_admitted_and_decoded_to_float32(name: str) -> None:
    arrays = model()
    msg = signed(arrays, Encoding.parse(name))
    assert len(msg.payload) < schema_payload_len(SCHEMA)
    assert len(msg.to_wire()) <= entry_frame_limit(SCHEMA)
    ok = admit_entry(msg, **admit_kwargs())
    assert ok.body.digest == hashlib.sha256(bytes(msg.payload)).hexdigest()
    for item in ok.body.tensors:
        got, want = ok.tensors[item.name], arrays[item.name]
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        if item.codec is not None:
            err = np.abs(got.astype(np.float64) - want.astype(np.float64)).reshape(-1)
            assert (err <= bound(item.codec, item.block, want)).all()
            assert not np.array_equal(got, want)  # it really went through the codec
        else:
            np.testing.assert_array_equal(got, want)


def test_the_signature_covers_the_encoded_bytes_and_the_codec() -> None:
    msg = signed(model(), Encoding("int8", 0))
    payload = bytearray(msg.payload)
    payload[-1] ^= 1  # a relay nudging one int8 value
    with pytest.raises(ProtocolError) as exc:
        admit_entry(Entry(msg.envelope, bytes(payload)), **admit_kwargs())
    assert exc.value.reason is Reason.PAYLOAD_MISMATCH
    # Relabelling int8 as another codec changes the signed body: the signature breaks.
    body = bytearray(msg.envelope.body)
    at = bytes(body).index(b"int8")
    body[at : at + 4] = b"inT8"
    forged = SignedEnvelope(fleet_id=msg.envelope.fleet_id, key=msg.envelope.key,
                            body=bytes(body), sig=msg.envelope.sig)
    with pytest.raises(ProtocolError) as exc:
        admit_entry(Entry(forged, msg.payload), **admit_kwargs())
    assert exc.value.reason is Reason.BAD_SIGNATURE


def _resigned_index(msg: Entry, index: tuple[TensorIndexItem, ...], payload: bytes) -> Entry:
    """A member signing a hand-made index and payload (what a buggy or hostile origin can)."""
    body = EntryBody.from_bytes(msg.envelope.body)
    fields = {f: getattr(body, f) for f in body.__slots__}
    fields.update(tensors=index, payload_len=len(payload),
                  digest=hashlib.sha256(payload).hexdigest())
    new = EntryBody(**fields).to_bytes()
    return Entry(SignedEnvelope.sign(ALICE, ENTRY_DOMAIN, FLEET, new), payload)


def _int8_entry(scales: list[float], q: list[int]) -> Entry:
    """fc.weight (12 values) in int8:16 with the given scale and values, the rest raw."""
    arrays = model()
    msg = signed(arrays, RAW)
    items, offset, parts = [], 0, []
    for name in sorted(arrays):
        if name == "fc.weight":
            data = np.array(scales, dtype="<f4").tobytes() + np.array(q, dtype=np.int8).tobytes()
            items.append(TensorIndexItem(name, "float32", (3, 4), offset, "int8", 0))
        else:
            data = np.ascontiguousarray(arrays[name]).tobytes()
            items.append(TensorIndexItem(name, str(arrays[name].dtype),
                                         tuple(arrays[name].shape), offset))
        parts.append(data)
        offset += len(data)
    return _resigned_index(msg, tuple(items), b"".join(parts))


@pytest.mark.parametrize("scale", [math.nan, math.inf, -0.5, MAX_INT8_SCALE * 2])
def test_an_int8_scale_that_is_not_finite_and_sane_is_refused(scale: float) -> None:
    admit_entry(_int8_entry([0.5], [1] * 12), **admit_kwargs())  # the well-formed one passes
    with pytest.raises(ProtocolError) as exc:
        admit_entry(_int8_entry([scale], [1] * 12), **admit_kwargs())
    assert exc.value.reason is Reason.BAD_ENCODING


def test_an_int8_value_of_minus_128_is_refused() -> None:
    with pytest.raises(ProtocolError) as exc:
        admit_entry(_int8_entry([0.5], [-128] + [0] * 11), **admit_kwargs())
    assert exc.value.reason is Reason.BAD_ENCODING
    admit_entry(_int8_entry([0.5], [-127] + [0] * 11), **admit_kwargs())


def _item(*extra: Any, dtype: str = "float32", shape: tuple[int, ...] = (64,)) -> list[Any]:
    return ["w", dtype, list(shape), 0, *extra]


@pytest.mark.parametrize(("fields", "why"), [
    (_item("int4", 0), "not allowed"),
    (_item("int8", MIN_INT8_BLOCK - 1), "block"),
    (_item("int8", MAX_INT8_BLOCK + 1), "block"),
    (_item("float16", 16), "no block size"),
    (_item("int8", 0, dtype="int64"), "never encoded"),
    (_item("float16", 0, dtype="float16"), "never encoded"),
    (_item("int8", 0, shape=(1,)), "larger than"),
    (_item("int8"), "5 fields"),
    (_item("int8", -1), re.escape("tensors[0].block")),
    (_item(8, 0), re.escape("tensors[0].codec")),
])
def test_an_index_item_no_codec_can_mean_is_malformed(fields: list[Any], why: str) -> None:
    with pytest.raises(ProtocolError, match=why) as exc:
        index_from_wire([fields], 1 << 20)
    assert exc.value.reason is Reason.MALFORMED


def test_an_index_item_longer_than_six_fields_is_refused_before_it_is_read() -> None:
    with pytest.raises(ProtocolError, match="limit 6") as exc:
        index_from_wire([_item("int8", 0, 0)], 1 << 20)
    assert exc.value.reason is Reason.TOO_LARGE


def test_an_encoded_index_must_tile_the_payload_in_the_codecs_sizes() -> None:
    wire = [_item("int8", 16)]  # 4 scales + 64 values
    assert index_from_wire(wire, 4 * 4 + 64)[0].nbytes == 80
    for wrong in (79, 81, 256):
        with pytest.raises(ProtocolError) as exc:
            index_from_wire(wire, wrong)
        assert exc.value.reason is Reason.PAYLOAD_MISMATCH


def test_an_encoded_length_that_fits_no_schema_codec_is_refused_before_hashing() -> None:
    arrays = model()
    msg = signed(arrays, Encoding("float16"))
    body = EntryBody.from_bytes(msg.envelope.body)
    # The schema's shape differs from the index's with the same raw size: the codec's size
    # of the schema's tensor says how long the payload must be.
    schema = dict(SCHEMA)
    schema["fc.weight"] = ("float32", (2, 6))
    with pytest.raises(ProtocolError) as exc:
        admit_entry(msg, **admit_kwargs(schema=schema))
    assert exc.value.reason is Reason.SHAPE_MISMATCH
    assert body.payload_len == len(msg.payload)


def test_decoding_is_deterministic_across_calls() -> None:
    arrays = model(3)
    a = signed(arrays, Encoding("int8", 16))
    b = signed(arrays, Encoding("int8", 16))
    assert a.payload == b.payload
    assert a.envelope.body == b.envelope.body


@pytest.mark.parametrize("text", ["int4", "float8", "int8:", "int8:x", "int8:8", "float16:16",
                                  "int8:2000000", ""])
def test_the_setting_names_what_is_allowed(text: str) -> None:
    with pytest.raises(ValueError, match=r"encoding|int8"):
        Encoding.parse(text)


def test_the_setting_round_trips_its_spelling() -> None:
    for text in ["float32", "float16", "bfloat16", "int8", "int8:256"]:
        assert str(Encoding.parse(text)) == text
    assert Encoding.parse("float32") == RAW
    assert RAW.lossless


def _pipeline(stream: bytes) -> None:
    dec = FrameDecoder(entry_frame_limit(SCHEMA))
    frames = dec.feed(stream)
    dec.close()
    for frame in frames:
        message = decode_frame(frame)
        if isinstance(message, Entry):
            admit_entry(message, **{**admit_kwargs(), "ledger": OriginLedger()})


@pytest.mark.parametrize("name", ["int8:16", "float16"])
def test_every_single_bit_flip_of_an_encoded_frame_is_rejected(name: str) -> None:
    frame = bytes(signed(model(), Encoding.parse(name)).to_wire())
    _pipeline(frame)
    assert surviving_bit_flips(frame, _pipeline) == []
