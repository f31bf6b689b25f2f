"""Tensor payload codec: allow-listed dtypes, raw little-endian bytes, zero-copy decode.

Layout (shared with ``peerd.core``, whose ``Entry.digest`` hashes the very same bytes):
tensors in ascending ``sorted()`` name order, packed back to back with no padding, each as
its raw little-endian C-contiguous bytes. The index lists ``(name, dtype, shape, offset)``
per tensor and must describe exactly that layout, so one set of tensors has one payload
and one digest. Never pickle, never ``torch.load``: decoding is ``numpy.frombuffer``.

bfloat16 has no numpy dtype: it travels as ``uint16`` arrays tagged ``"bfloat16"``. Numpy
only, no torch: the torch side (``peerd.node.state``, ``peerd.store.spool``) reinterprets
the same 2-byte words as ``torch.bfloat16`` without a copy.

A float32 tensor may instead travel encoded (:mod:`peerd.protocol.encoding`): its index item
then has two more fields, ``[name, "float32", shape, offset, codec, block]``, and its bytes
are the codec's; the dtype stays the schema's, decoding gives float32 (a copy).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from peerd.core.reasons import Reason
from peerd.protocol.encoding import (
    RAW,
    Encoding,
    check_index_item,
    decode_array,
    encode_array,
    encoded_nbytes,
)
from peerd.protocol.errors import ProtocolError
from peerd.protocol.limits import MAX_INT, MAX_NDIM, MAX_TENSOR_NAME_LEN, MAX_TENSORS
from peerd.protocol.wire import as_int, as_list, as_str, malformed

#: Wire dtype name -> numpy storage dtype (explicitly little-endian). float64 is allowed
#: because some buffers are float64 and an entry's dtypes must equal the local schema's
#: anyway, so allowing it on the wire widens nothing. Object, complex, string and
#: datetime dtypes are absent on purpose: they are not model parameters, and object arrays
#: would need pickle.
DTYPES: Mapping[str, np.dtype[Any]] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype("<u2"),
    "float64": np.dtype("<f8"),
    "int64": np.dtype("<i8"),
    "int32": np.dtype("<i4"),
    "int16": np.dtype("<i2"),
    "int8": np.dtype("i1"),
    "uint8": np.dtype("u1"),
    "bool": np.dtype("?"),
}
FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
#: Elements per chunk when computing float64 norms: bounds the temporary float64 copy.
_NORM_CHUNK = 1 << 20

#: A local schema as the protocol sees it: name -> (wire dtype name, shape).
Schema = Mapping[str, tuple[str, tuple[int, ...]]]


class SpecLike(Protocol):
    """Anything shaped like ``peerd.core.entry.TensorSpec`` (not imported: it needs torch)."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...


def schema_from_specs(specs: Iterable[SpecLike]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Adapter from the core's ``Schema.specs`` to the mapping used here."""
    out = {s.name: (s.dtype, tuple(s.shape)) for s in specs}
    for dtype, _ in out.values():
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not allowed on the wire")
    return out


@dataclass(frozen=True, slots=True)
class TensorIndexItem:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    #: The codec its bytes are in (None: raw ``dtype`` bytes) and int8's values per scale.
    codec: str | None = None
    block: int = 0

    @property
    def nbytes(self) -> int:
        if self.codec is not None:
            return encoded_nbytes(self.codec, self.block, math.prod(self.shape))
        return math.prod(self.shape) * DTYPES[self.dtype].itemsize

    def to_wire(self) -> list[Any]:
        raw = [self.name, self.dtype, list(self.shape), self.offset]
        # A raw item keeps its four fields: a float32 entry's bytes are those of before.
        return raw if self.codec is None else [*raw, self.codec, self.block]


def dtype_name(array: npt.NDArray[Any], bfloat16: bool = False) -> str:
    """Wire name of a numpy array's dtype (``bfloat16=True`` tags a uint16 array)."""
    if bfloat16:
        if array.dtype.newbyteorder("<") != np.dtype("<u2"):
            raise ValueError("a bfloat16 tensor must be carried as a uint16 array")
        return "bfloat16"
    little = array.dtype.newbyteorder("<")  # a big-endian source is byteswapped when packed
    for name, dt in DTYPES.items():
        if name != "bfloat16" and little == dt:
            return name
    raise ValueError(f"dtype {array.dtype} is not allowed on the wire")


def tensor_views(
    tensors: Mapping[str, npt.NDArray[Any]], bfloat16: frozenset[str] = frozenset(),
    encoding: Encoding = RAW,
) -> tuple[tuple[TensorIndexItem, ...], tuple[memoryview, ...]]:
    """The index and each tensor's payload bytes, in wire order, copying nothing when it can.

    C-contiguous little-endian arrays are viewed in place (the usual case: an origin signs
    and sends its parameters without copying them); others are converted, one copy each.
    The views alias the caller's arrays: they must not change until the frame is written.
    ``encoding``: float32 tensors in that codec where it can hold them (new bytes each).
    """
    if len(tensors) > MAX_TENSORS:
        raise ValueError(f"more than {MAX_TENSORS} tensors")
    index: list[TensorIndexItem] = []
    views: list[memoryview] = []
    offset = 0
    for name in sorted(tensors):
        arr = tensors[name]
        dtype = dtype_name(arr, name in bfloat16)
        encoded = encode_array(arr, encoding)  # None: raw (not float32, or it cannot hold it)
        if encoded is not None:
            item = TensorIndexItem(name, dtype, tuple(arr.shape), offset, encoding.codec,
                                   encoding.block)
            views.append(memoryview(encoded))
        else:
            item = TensorIndexItem(name, dtype, tuple(arr.shape), offset)
            # Converts only if big-endian or not C-contiguous; otherwise returns arr itself.
            packed = np.ascontiguousarray(arr, dtype=DTYPES[item.dtype])
            views.append(packed.reshape(-1).data.cast("B"))
        index.append(item)
        offset += item.nbytes
    return tuple(index), tuple(views)


def encode_tensors(
    tensors: Mapping[str, npt.NDArray[Any]], bfloat16: frozenset[str] = frozenset(),
    encoding: Encoding = RAW,
) -> tuple[tuple[TensorIndexItem, ...], memoryview]:
    """The index and the payload as one contiguous buffer (one copy of every tensor)."""
    index, views = tensor_views(tensors, bfloat16, encoding)
    # numpy's allocator asks for huge pages: page faults on a fresh 44 MB bytearray cost
    # more than the copy itself (measured with benchmarks/bench_protocol.py).
    buffer = np.empty(sum(len(v) for v in views), dtype=np.uint8)
    for item, view in zip(index, views, strict=True):
        buffer[item.offset : item.offset + len(view)] = np.frombuffer(view, dtype=np.uint8)
    return index, buffer.data


def index_encoding(index: Iterable[TensorIndexItem]) -> Encoding:
    """The encoding an origin chose, as its index shows it: the codec of its encoded
    tensors (float32 when none is; a tensor the codec cannot hold stays raw beside them)."""
    for item in index:
        if item.codec is not None:
            return Encoding(item.codec, item.block)
    return RAW


def index_from_wire(obj: Any, payload_len: int) -> tuple[TensorIndexItem, ...]:
    """Type-check an index and prove it tiles ``payload_len`` bytes exactly, in name order."""
    items = as_list(obj, "tensors", MAX_TENSORS)
    out: list[TensorIndexItem] = []
    offset = 0
    prev: str | None = None
    for i, raw in enumerate(items):
        fields = as_list(raw, f"tensors[{i}]", 6)
        if len(fields) not in (4, 6):
            malformed(f"tensors[{i}] has {len(fields)} fields, expected 4 or 6")
        name = as_str(fields[0], f"tensors[{i}].name", MAX_TENSOR_NAME_LEN)
        if prev is not None and not prev < name:
            malformed("tensor names must be unique and in ascending order")
        prev = name
        dtype = as_str(fields[1], f"tensors[{i}].dtype", 16)
        if dtype not in DTYPES:
            malformed(f"dtype {dtype!r} is not allowed")
        dims = as_list(fields[2], f"tensors[{i}].shape", MAX_NDIM)
        shape = tuple(as_int(d, f"tensors[{i}].shape") for d in dims)
        item_offset = as_int(fields[3], f"tensors[{i}].offset")
        if item_offset != offset:
            malformed(f"tensor {name!r} at offset {item_offset}, expected {offset} (no padding)")
        codec, block = None, 0
        if len(fields) == 6:
            codec = as_str(fields[4], f"tensors[{i}].codec", 16)
            block = as_int(fields[5], f"tensors[{i}].block")
            check_index_item(codec, block, dtype, math.prod(shape))
        item = TensorIndexItem(name, dtype, shape, item_offset, codec, block)
        offset += item.nbytes  # exact Python ints: a huge shape cannot wrap around
        if offset > min(payload_len, MAX_INT):
            raise ProtocolError(Reason.PAYLOAD_MISMATCH, "tensor index exceeds the payload length")
        out.append(item)
    if offset != payload_len:
        raise ProtocolError(
            Reason.PAYLOAD_MISMATCH, f"tensor index covers {offset} bytes, payload is {payload_len}"
        )
    return tuple(out)


def schema_payload_len(schema: Schema) -> int:
    """Bytes a raw payload matching ``schema`` has: the bound checked before reading one
    (an encoded payload is never larger, see peerd.protocol.encoding)."""
    return sum(math.prod(shape) * DTYPES[dt].itemsize for dt, shape in schema.values())


def expected_payload_len(schema: Schema, index: tuple[TensorIndexItem, ...]) -> int:
    """Bytes a payload for ``schema`` has with the codecs ``index`` names for its tensors:
    the schema's shapes, not the index's, set each tensor's size."""
    codecs = {item.name: (item.codec, item.block) for item in index}
    total = 0
    for name, (dt, shape) in schema.items():
        codec, block = codecs.get(name, (None, 0))
        numel = math.prod(shape)
        total += (numel * DTYPES[dt].itemsize if codec is None
                  else encoded_nbytes(codec, block, numel))
    return total


def check_against_schema(index: tuple[TensorIndexItem, ...], schema: Schema) -> None:
    """Refuse an index whose names, dtypes or shapes differ from the local model's."""
    names = [item.name for item in index]
    if names != sorted(schema):
        raise ProtocolError(Reason.SHAPE_MISMATCH, "tensor names differ from the local schema")
    for item in index:
        dtype, shape = schema[item.name]
        if item.dtype != dtype:
            raise ProtocolError(
                Reason.DTYPE_MISMATCH, f"{item.name}: dtype {item.dtype}, schema has {dtype}"
            )
        if item.shape != tuple(shape):
            raise ProtocolError(
                Reason.SHAPE_MISMATCH, f"{item.name}: shape {item.shape}, schema has {shape}"
            )


def decode_tensors(
    index: tuple[TensorIndexItem, ...], payload: bytes | bytearray | memoryview
) -> dict[str, npt.NDArray[Any]]:
    """Zero-copy read-only views into ``payload`` (which the index must tile exactly);
    encoded tensors are decoded to new read-only float32 arrays."""
    view = memoryview(payload).toreadonly()
    if sum(item.nbytes for item in index) != len(view):
        raise ProtocolError(Reason.PAYLOAD_MISMATCH, "payload length differs from the index")
    out: dict[str, npt.NDArray[Any]] = {}
    for item in index:
        data = view[item.offset : item.offset + item.nbytes]
        if item.codec is not None:  # decoded into a new float32 array, checked on the way
            out[item.name] = decode_array(item.codec, item.block, item.shape, data, item.name)
            continue
        arr = np.frombuffer(data, dtype=DTYPES[item.dtype])
        if item.dtype == "bool" and arr.size and arr.view(np.uint8).max() > 1:
            # numpy/torch assume bool bytes are 0 or 1; other values are undefined behaviour.
            malformed(f"{item.name}: bool tensor holds bytes other than 0 and 1")
        out[item.name] = arr.reshape(item.shape)
    return out


def as_float64_chunks(arr: npt.NDArray[Any], dtype: str) -> Any:
    """Yield float64 chunks of a float tensor (bfloat16 widened via its float32 bits)."""
    flat = arr.reshape(-1)
    for start in range(0, flat.size, _NORM_CHUNK):
        chunk = flat[start : start + _NORM_CHUNK]
        if dtype == "bfloat16":
            chunk = (chunk.astype(np.uint32) << 16).view(np.float32)
        yield chunk.astype(np.float64)


def finite_and_norm(
    tensors: Mapping[str, npt.NDArray[Any]], index: tuple[TensorIndexItem, ...]
) -> tuple[bool, float]:
    """(all float values finite, global L2 norm) with squares summed in float64.

    float32 squares overflow at ~1.8e19, so a model of 1e20 values would report an infinite
    norm (and slip past or trip a bound for the wrong reason) if summed in its own dtype.
    """
    total = 0.0
    finite = True
    for item in index:
        if item.dtype not in FLOAT_DTYPES:
            continue
        for chunk in as_float64_chunks(tensors[item.name], item.dtype):
            if not np.isfinite(chunk).all():
                finite = False
                continue
            total += float(np.dot(chunk, chunk))
    return finite, math.sqrt(total)


def check_finite(
    tensors: Mapping[str, npt.NDArray[Any]], index: tuple[TensorIndexItem, ...]
) -> float:
    """Refuse NaN/Inf (NON_FINITE); return the float64 L2 norm for the caller's bound."""
    finite, norm = finite_and_norm(tensors, index)
    if not finite:
        raise ProtocolError(Reason.NON_FINITE, "NaN or Inf in the parameters")
    return norm
