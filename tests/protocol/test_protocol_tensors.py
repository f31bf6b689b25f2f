"""Tensor codec: layout, allow-list, zero copy, and values that lie about themselves."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from peerd.core.reasons import Reason
from peerd.protocol.errors import ProtocolError
from peerd.protocol.tensors import (
    DTYPES,
    TensorIndexItem,
    check_against_schema,
    check_finite,
    decode_tensors,
    encode_tensors,
    finite_and_norm,
    index_from_wire,
    schema_from_specs,
    schema_payload_len,
)
from tests.protocol.helpers import SCHEMA, tensors


def wire_index(items: list[list[Any]], payload_len: int) -> tuple[TensorIndexItem, ...]:
    return index_from_wire(items, payload_len)


def reason(fn: Any, *args: Any) -> Reason:
    with pytest.raises(ProtocolError) as exc:
        fn(*args)
    return exc.value.reason


def test_layout_is_sorted_packed_little_endian() -> None:
    arrays = {"b": np.array([1, 2], dtype=">i4"), "a": np.array([[1.5]], dtype=np.float64)}
    index, payload = encode_tensors(arrays)
    assert [i.name for i in index] == ["a", "b"]
    assert [i.offset for i in index] == [0, 8]
    assert bytes(payload) == np.float64(1.5).tobytes() + np.array([1, 2], "<i4").tobytes()
    # Same digest as hashing each tensor's little-endian bytes in sorted order (the core's).
    h = hashlib.sha256()
    for name in sorted(arrays):
        h.update(
            np.ascontiguousarray(arrays[name])
            .astype(arrays[name].dtype.newbyteorder("<"))
            .tobytes()
        )
    assert hashlib.sha256(payload).hexdigest() == h.hexdigest()


def test_non_contiguous_source_is_packed_in_c_order() -> None:
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    index, payload = encode_tensors({"t": base.T})
    assert bytes(payload) == np.ascontiguousarray(base.T).tobytes()
    assert index[0].shape == (4, 3)


def test_decode_is_zero_copy_and_read_only() -> None:
    index, payload = encode_tensors(tensors())
    out = decode_tensors(index, payload)
    arr = out["fc.weight"]
    assert np.shares_memory(arr, np.frombuffer(payload, dtype=np.uint8))
    assert not arr.flags.writeable
    for name, original in tensors().items():
        np.testing.assert_array_equal(out[name], original)


def test_bfloat16_travels_as_uint16_bits() -> None:
    bits = np.array([0x3F80, 0x4000, 0xC040], dtype=np.uint16)  # 1.0, 2.0, -3.0
    index, payload = encode_tensors({"w": bits}, bfloat16=frozenset({"w"}))
    assert index[0].dtype == "bfloat16"
    out = decode_tensors(index, payload)
    np.testing.assert_array_equal(out["w"], bits)
    _, norm = finite_and_norm(out, index)
    assert norm == pytest.approx(np.sqrt(1 + 4 + 9))


@pytest.mark.parametrize(
    "dtype", ["object", "complex64", "float128", "<U4", "int", "torch.float32"]
)
def test_object_and_other_dtypes_refused_on_the_wire(dtype: str) -> None:
    assert reason(wire_index, [["w", dtype, [1], 0]], 8) is Reason.MALFORMED


def test_object_arrays_refused_when_encoding() -> None:
    with pytest.raises(ValueError, match="dtype object is not allowed"):
        encode_tensors({"w": np.array([object()], dtype=object)})


def test_every_allowed_dtype_round_trips() -> None:
    arrays = {name: np.zeros((2, 3), dtype=dt) for name, dt in DTYPES.items()}
    index, payload = encode_tensors(arrays, bfloat16=frozenset({"bfloat16"}))
    assert {i.name: i.dtype for i in index} == {n: n for n in DTYPES}
    decode_tensors(index_from_wire([i.to_wire() for i in index], len(payload)), payload)


def test_index_with_padding_gap_or_overlap() -> None:
    assert reason(wire_index, [["a", "uint8", [4], 0], ["b", "uint8", [4], 5]], 9) is (
        Reason.MALFORMED
    )
    assert reason(wire_index, [["a", "uint8", [4], 0], ["b", "uint8", [4], 2]], 6) is (
        Reason.MALFORMED
    )


def test_index_out_of_name_order_or_duplicated() -> None:
    assert reason(wire_index, [["b", "uint8", [1], 0], ["a", "uint8", [1], 1]], 2) is (
        Reason.MALFORMED
    )
    assert reason(wire_index, [["a", "uint8", [1], 0], ["a", "uint8", [1], 1]], 2) is (
        Reason.MALFORMED
    )


def test_payload_longer_or_shorter_than_the_index() -> None:
    assert reason(wire_index, [["a", "float32", [4], 0]], 15) is Reason.PAYLOAD_MISMATCH
    assert reason(wire_index, [["a", "float32", [4], 0]], 17) is Reason.PAYLOAD_MISMATCH
    index, payload = encode_tensors({"a": np.zeros(4, np.float32)})
    assert reason(decode_tensors, index, bytes(payload) + b"\x00") is Reason.PAYLOAD_MISMATCH
    assert reason(decode_tensors, index, payload[:-1]) is Reason.PAYLOAD_MISMATCH


def test_shape_whose_element_count_overflows_int64() -> None:
    # 2**40 * 2**40 elements would wrap a C int64; exact Python ints just exceed the payload.
    assert reason(wire_index, [["a", "float32", [2**40, 2**40], 0]], 16) is (
        Reason.PAYLOAD_MISMATCH
    )
    assert reason(wire_index, [["a", "float32", [-1, 4], 0]], 16) is Reason.MALFORMED
    assert reason(wire_index, [["a", "float32", [1] * 17, 0]], 4) is Reason.TOO_LARGE


def test_shape_and_dtype_mismatch_against_the_local_schema() -> None:
    index, _ = encode_tensors(tensors())
    check_against_schema(index, SCHEMA)
    wrong_shape = {**SCHEMA, "fc.weight": ("float32", (4, 3))}
    assert reason(check_against_schema, index, wrong_shape) is Reason.SHAPE_MISMATCH
    wrong_dtype = {**SCHEMA, "fc.bias": ("float16", (3,))}
    assert reason(check_against_schema, index, wrong_dtype) is Reason.DTYPE_MISMATCH
    missing = {k: v for k, v in SCHEMA.items() if k != "fc.bias"}
    assert reason(check_against_schema, index, missing) is Reason.SHAPE_MISMATCH
    assert schema_payload_len(SCHEMA) == 12 * 4 + 3 * 4 + 8


def test_bool_bytes_other_than_zero_and_one() -> None:
    index = index_from_wire([["m", "bool", [3], 0]], 3)
    assert decode_tensors(index, b"\x00\x01\x01")["m"].tolist() == [False, True, True]
    assert reason(decode_tensors, index, b"\x00\x02\x01") is Reason.MALFORMED


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_nan_inf_flagged(bad: float, dtype: str) -> None:
    arr = np.ones(5, dtype=dtype)
    arr[3] = bad
    index, payload = encode_tensors({"w": arr, "n": np.array([2**62], np.int64)})
    out = decode_tensors(index, payload)
    assert reason(check_finite, out, index) is Reason.NON_FINITE


def test_bfloat16_nan_flagged() -> None:
    index, payload = encode_tensors(
        {"w": np.array([0x3F80, 0x7FC0], np.uint16)}, bfloat16=frozenset({"w"})
    )
    assert reason(check_finite, decode_tensors(index, payload), index) is Reason.NON_FINITE


def test_float32_norm_that_overflows_float32_is_computed_in_float64() -> None:
    arr: npt.NDArray[np.float32] = np.full(1000, 1e20, dtype=np.float32)
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.sqrt(np.sum(arr * arr)))  # the naive float32 way overflows
    index, payload = encode_tensors({"w": arr})
    norm = check_finite(decode_tensors(index, payload), index)
    assert norm == pytest.approx(float(np.float32(1e20)) * np.sqrt(1000), rel=1e-9)


def test_schema_from_core_like_specs() -> None:
    class Spec:
        def __init__(self, name: str, dtype: str, shape: tuple[int, ...]) -> None:
            self.name, self.dtype, self.shape = name, dtype, shape

    assert schema_from_specs([Spec("a", "float32", (2,))]) == {"a": ("float32", (2,))}
    with pytest.raises(ValueError, match="dtype 'complex64' is not allowed"):
        schema_from_specs([Spec("a", "complex64", (2,))])
