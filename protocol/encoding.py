"""Compact encodings of float32 weight tensors on the wire (issue 27: slow links).

An origin may carry each ``float32`` tensor of a weight entry in a narrower *codec* instead
of its raw bytes; the tensor index says which, per tensor, and the payload SHA-256 and the
signature cover the encoded bytes, exactly as they cross the wire. A receiver verifies those
bytes, then decodes them to float32 (the local schema's dtype, which the blend works in).

Codecs and the bytes of one tensor of ``n`` values:

* ``float16``: IEEE half, little-endian, round to nearest even (``2 n`` bytes);
* ``bfloat16``: the high 16 bits of the float32 after round to nearest even (``2 n``);
* ``int8``: symmetric: ``x ≈ q · s`` with ``q`` in [-127, 127]; the tensor's bytes are its
  ``k`` float32 scales (little-endian) followed by its ``n`` int8 values. ``block = 0``:
  one scale for the tensor (``k = 1``); ``block = B``: one scale per ``B`` consecutive
  values in C order, the last block possibly shorter (``k = ceil(n / B)``).
  An origin computes ``s = max|x| / 127`` per block (0 for an all-zero block) and
  ``q = rint(x / s)``.

Only float32 tensors are encoded (integer buffers never are: a rounded counter is a different
counter), and only when the encoding is smaller than the raw bytes, so an entry is never
larger than its float32 form and the schema-sized frame limit still bounds it. A tensor whose
values the codec cannot hold (non-finite, or beyond float16/bfloat16's range) is carried raw:
receivers then refuse a non-finite model as before, instead of a silently clipped one.

Numpy only, no torch; every check on hostile bytes happens here, before a value is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from peerd.core.reasons import Reason
from peerd.protocol.errors import ProtocolError
from peerd.protocol.limits import MAX_INT8_BLOCK, MAX_INT8_SCALE, MIN_INT8_BLOCK
from peerd.protocol.wire import malformed

#: Per-tensor codecs, by their wire name.
CODECS = ("float16", "bfloat16", "int8")
#: The fleet-wide setting's names: float32 (raw, today's bytes), or a codec.
ENCODINGS = ("float32", *CODECS)
#: The one dtype a codec may stand in for.
ENCODED_DTYPE = "float32"
_F32 = np.dtype("<f4")
_Q_MAX = 127


@dataclass(frozen=True, slots=True)
class Encoding:
    """How an origin encodes its float32 tensors: ``codec`` None is raw float32; ``block``
    is int8's values per scale (0: one scale per tensor) and 0 for the other codecs."""

    codec: str | None = None
    block: int = 0

    def __post_init__(self) -> None:
        problem = codec_problem(self.codec, self.block)
        if problem is not None:
            raise ValueError(problem)

    @classmethod
    def parse(cls, text: str) -> Encoding:
        """``float32``, ``float16``, ``bfloat16``, ``int8`` (a scale per tensor) or
        ``int8:B`` (a scale per B values); ValueError says what is allowed."""
        name, sep, arg = text.partition(":")
        if name not in ENCODINGS or (sep and name != "int8"):
            raise ValueError(f"unknown entry encoding {text!r}: float32, float16, bfloat16, "
                             f"int8 or int8:B (B values per scale, "
                             f"{MIN_INT8_BLOCK} to {MAX_INT8_BLOCK})")
        if not sep:
            return cls(None if name == "float32" else name, 0)
        if not arg.isdigit():
            raise ValueError(f"int8:B needs an integer B, got {arg!r}")
        return cls("int8", int(arg))

    def __str__(self) -> str:
        if self.codec is None:
            return "float32"
        return f"int8:{self.block}" if self.block else self.codec

    @property
    def lossless(self) -> bool:
        return self.codec is None



def codec_problem(codec: str | None, block: int) -> str | None:
    """Why (codec, block) is no valid pair (None: it is one)."""
    if codec is None:
        return None if block == 0 else "a raw tensor has no block size"
    if codec not in CODECS:
        return f"codec {str(codec)[:16]!r} is not allowed"
    if codec != "int8":
        return None if block == 0 else f"{codec} has no block size (must be 0)"
    if block != 0 and not MIN_INT8_BLOCK <= block <= MAX_INT8_BLOCK:
        return f"int8 block {block} outside {MIN_INT8_BLOCK}..{MAX_INT8_BLOCK} (0: per tensor)"
    return None


#: Raw float32: today's bytes, the default.
RAW = Encoding()


def scale_count(block: int, numel: int) -> int:
    """Scales an int8 tensor of ``numel`` values carries."""
    if numel == 0:
        return 0
    return 1 if block == 0 else -(-numel // block)


def encoded_nbytes(codec: str, block: int, numel: int) -> int:
    """Bytes of one tensor of ``numel`` float32 values in ``codec`` (exact Python ints)."""
    if codec == "int8":
        return 4 * scale_count(block, numel) + numel
    return 2 * numel


def check_index_item(codec: str, block: int, dtype: str, numel: int) -> None:
    """Refuse an index item whose codec cannot describe its tensor (MALFORMED)."""
    problem = codec_problem(codec, block)
    if problem is not None:
        malformed(problem)
    if dtype != ENCODED_DTYPE:
        malformed(f"a {dtype} tensor is never encoded (only {ENCODED_DTYPE})")
    if encoded_nbytes(codec, block, numel) > 4 * numel:
        # An origin carries such a tensor raw; this keeps every entry within its schema's
        # float32 bytes, the frame limit a receiver sets before reading (admission).
        malformed(f"{codec} encoding is larger than the tensor's float32 bytes")


# ---------------------------------------------------------------------------- encoding
def _bfloat16_words(x: npt.NDArray[np.float32]) -> npt.NDArray[np.uint16]:
    bits = x.view(np.uint32)
    # Round to nearest, ties to even, on the 16 bits dropped (finite inputs only).
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype("<u2")


_F32_TINY = np.float32(np.finfo(np.float32).tiny)


def _int8(x: npt.NDArray[np.float32], block: int) -> bytes | None:
    n = x.size
    k = scale_count(block, n)
    if k == 0:
        return b""
    size = n if block == 0 else block
    padded = np.zeros(k * size, dtype=np.float32)
    padded[:n] = x
    rows = padded.reshape(k, size)
    peaks = np.abs(rows).max(axis=1)
    scales = (peaks / np.float32(_Q_MAX)).astype(np.float32)
    if not (np.isfinite(scales).all() and (scales <= MAX_INT8_SCALE).all()):
        return None
    # A block whose peak is tiny (below 127 × float32's smallest normal, ~1.5e-36) would get
    # a subnormal or zero scale, too coarse for the codec's half-step error bound (found by
    # the property test: [0, 1.7e-44] decoded as [0, 0]): carry the tensor raw.
    if ((peaks > 0) & (scales < _F32_TINY)).any():
        return None
    safe = np.where(scales > 0, scales, np.float32(1))
    q = np.clip(np.rint(rows / safe[:, None]), -_Q_MAX, _Q_MAX).astype(np.int8)
    out: bytes = scales.astype(_F32).tobytes() + q.reshape(-1)[:n].tobytes()
    return out


def encode_array(array: npt.NDArray[Any], encoding: Encoding) -> bytes | None:
    """``array`` (float32) in ``encoding``'s codec, or None: carry it raw (raw encoding,
    another dtype, values the codec cannot hold, or an encoding no smaller than raw)."""
    codec = encoding.codec
    if codec is None or array.dtype.newbyteorder("<") != _F32:
        return None
    if encoded_nbytes(codec, encoding.block, array.size) > 4 * array.size:
        return None
    x = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
    if not np.isfinite(x).all():
        return None
    if codec == "int8":
        return _int8(x, encoding.block)
    words: npt.NDArray[Any]
    if codec == "float16":
        with np.errstate(over="ignore"):
            words = x.astype("<f2")
        ok = np.isfinite(words).all()
    else:
        words = _bfloat16_words(x)
        ok = bool(((words & 0x7F80) != 0x7F80).all())  # rounding reached ±Inf
    return words.tobytes() if ok else None


# ---------------------------------------------------------------------------- decoding
def decode_array(
    codec: str, block: int, shape: tuple[int, ...], data: memoryview, name: str
) -> npt.NDArray[np.float32]:
    """The float32 values of one encoded tensor (a new read-only array). ``data`` must be
    exactly its encoded bytes (the index proved the length); its content is hostile."""
    numel = math.prod(shape)
    if len(data) != encoded_nbytes(codec, block, numel):
        raise ProtocolError(Reason.PAYLOAD_MISMATCH, f"{name}: {len(data)} bytes for {codec}")
    out: npt.NDArray[np.float32]
    if codec == "float16":
        out = np.frombuffer(data, dtype="<f2").astype(np.float32)
    elif codec == "bfloat16":
        words = np.frombuffer(data, dtype="<u2")
        out = (words.astype(np.uint32) << np.uint32(16)).view(np.float32)
    else:
        out = _decode_int8(block, numel, data, name)
    out = out.reshape(shape)
    out.flags.writeable = False
    return out


def _decode_int8(block: int, numel: int, data: memoryview, name: str) -> npt.NDArray[np.float32]:
    k = scale_count(block, numel)
    scales = np.frombuffer(data[: 4 * k], dtype=_F32)
    q = np.frombuffer(data[4 * k :], dtype=np.int8)
    # Scales set every value's magnitude: NaN, a negative (the sign is q's) or one whose
    # 127 · s overflows float32 would make an Inf out of finite-looking bytes.
    if not (np.isfinite(scales).all() and (scales >= 0).all() and (scales <= MAX_INT8_SCALE).all()):
        raise ProtocolError(Reason.BAD_ENCODING, f"{name}: int8 scale not finite, in [0, "
                                                 f"{MAX_INT8_SCALE:.3g}]")
    if q.size and int(q.min()) < -_Q_MAX:
        raise ProtocolError(Reason.BAD_ENCODING, f"{name}: int8 value -128 (symmetric: ±127)")
    out = q.astype(np.float32)  # the one float32 array: scaled in place, block by block
    if k == 0:
        return out
    size = numel if block == 0 else block
    full = numel // size
    head = full * size
    blocks = out[:head].reshape(full, size)  # a view: out is contiguous
    blocks *= scales[:full, None]
    if head < numel:
        out[head:] *= scales[-1]
    return out
