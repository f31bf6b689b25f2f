"""msgpack with explicit limits, and strict field readers for what comes out of it.

msgpack happily decodes NaN floats, ext types, integer keys, duplicate keys and huge
container headers. The decoder below is configured to refuse the dangerous ones *before*
allocation; the :class:`Fields` reader then type-checks every value, because "it parsed"
says nothing about "it is what the message needs". It knows no message: which keys and
types each one has is for ``messages``, ``envelope``, ``entry`` and ``manifest`` to say.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import msgpack

from peerd.core.reasons import Reason
from peerd.protocol.errors import ProtocolError
from peerd.protocol.limits import (
    MAX_ARRAY_LEN,
    MAX_BIN_LEN,
    MAX_DEPTH,
    MAX_INT,
    MAX_MAP_LEN,
    MAX_STR_LEN,
)

T = TypeVar("T")


def malformed(message: str) -> NoReturn:
    raise ProtocolError(Reason.MALFORMED, message)


def _refuse_ext(code: int, data: bytes) -> NoReturn:
    # No peerd message uses ext types (timestamps included); accepting them would give a
    # peer a way to make us build objects the type checker never expected.
    malformed(f"msgpack ext type {code} is not allowed")


def _pairs_to_dict(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    # Duplicate keys would let two parsers disagree on a message's meaning.
    out = dict(pairs)
    if len(out) != len(pairs):
        malformed("duplicate key in msgpack map")
    return out


def _unpacker(max_buffer: int) -> msgpack.Unpacker:
    return msgpack.Unpacker(
        max_buffer_size=max_buffer,
        max_bin_len=MAX_BIN_LEN,
        max_str_len=MAX_STR_LEN,
        max_array_len=MAX_ARRAY_LEN,
        max_map_len=MAX_MAP_LEN,
        max_ext_len=0,
        ext_hook=_refuse_ext,
        strict_map_key=True,
        raw=False,
        use_list=True,
        object_pairs_hook=_pairs_to_dict,
    )


def unpack_prefix(data: bytes | bytearray | memoryview, max_len: int) -> tuple[Any, int]:
    """Decode the one msgpack object at the start of ``data``; return it and its length.

    Only the first ``max_len`` bytes are looked at (the head of an Entry frame is followed by
    a large raw payload that must not be copied into the msgpack buffer).
    """
    view = memoryview(data)[:max_len]
    unpacker = _unpacker(max(len(view), 1))
    try:
        unpacker.feed(view)
        obj = unpacker.unpack()
        consumed = unpacker.tell()
    except ProtocolError:
        raise
    except msgpack.OutOfData:
        malformed("truncated msgpack object")
    # msgpack's exception set is not a closed, documented set
    except Exception as exc:  # noqa: BLE001
        malformed(f"invalid msgpack: {type(exc).__name__}: {exc}")
    _check_depth(obj, 0)
    return obj, consumed


def unpack_exact(data: bytes | bytearray | memoryview, max_len: int) -> Any:
    """Decode exactly one msgpack object spanning all of ``data`` (no trailing bytes)."""
    if len(data) > max_len:
        raise ProtocolError(Reason.TOO_LARGE, f"{len(data)} bytes exceed the limit {max_len}")
    obj, consumed = unpack_prefix(data, max_len)
    if consumed != len(data):
        malformed(f"{len(data) - consumed} trailing bytes after the msgpack object")
    return obj


def pack(obj: Any) -> bytes:
    """Encode with the settings that make our output deterministic (golden vectors)."""
    out = msgpack.packb(obj, use_bin_type=True, use_single_float=False)
    assert isinstance(out, bytes)
    return out


def _check_depth(obj: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        malformed(f"nesting deeper than {MAX_DEPTH}")
    if isinstance(obj, list):
        for item in obj:
            _check_depth(item, depth + 1)
    elif isinstance(obj, dict):
        for item in obj.values():
            _check_depth(item, depth + 1)


# --- strict value checks ---------------------------------------------------------------


def as_int(value: Any, what: str, lo: int = 0, hi: int = MAX_INT) -> int:
    # bool is an int subclass; a peer sending True for a version is malformed, not 1.
    if type(value) is not int:
        malformed(f"{what} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        malformed(f"{what}={value} outside [{lo}, {hi}]")
    return value


def as_float(value: Any, what: str, lo: float = 0.0, hi: float = math.inf) -> float:
    if type(value) is not float:
        malformed(f"{what} must be a float, got {type(value).__name__}")
    if not math.isfinite(value):  # NaN compares false with everything: refuse it outright
        malformed(f"{what} must be finite")
    if not lo <= value <= hi:
        malformed(f"{what}={value} outside [{lo}, {hi}]")
    return value


def as_bytes(value: Any, what: str, length: int | None = None, max_len: int = MAX_BIN_LEN) -> bytes:
    if type(value) is not bytes:
        malformed(f"{what} must be bytes, got {type(value).__name__}")
    if length is not None and len(value) != length:
        malformed(f"{what} must be {length} bytes, got {len(value)}")
    if len(value) > max_len:
        malformed(f"{what} longer than {max_len} bytes")
    return value


def as_str(value: Any, what: str, max_len: int = MAX_STR_LEN, min_len: int = 1) -> str:
    if type(value) is not str:
        malformed(f"{what} must be a string, got {type(value).__name__}")
    if not min_len <= len(value) <= max_len:
        malformed(f"{what} length {len(value)} outside [{min_len}, {max_len}]")
    return value


def as_list(value: Any, what: str, max_len: int, length: int | None = None) -> list[Any]:
    if type(value) is not list:
        malformed(f"{what} must be an array, got {type(value).__name__}")
    if len(value) > max_len:
        raise ProtocolError(Reason.TOO_LARGE, f"{what} has {len(value)} items, limit {max_len}")
    if length is not None and len(value) != length:
        malformed(f"{what} must have {length} items, got {len(value)}")
    return value


class Fields:
    """Reads a msgpack map with an exact key set: missing or unknown keys are malformed.

    Unknown keys are refused rather than ignored: new fields come with a new protocol
    version, so a message we cannot fully understand is never half-processed.
    """

    def __init__(self, value: Any, what: str, keys: frozenset[str]) -> None:
        if type(value) is not dict:
            malformed(f"{what} must be a map, got {type(value).__name__}")
        for key in value:
            if type(key) is not str:
                malformed(f"{what} has a non-string key")
        present = frozenset(value)
        if present != keys:
            missing = sorted(keys - present)
            unknown = sorted(present - keys)
            malformed(f"{what}: missing keys {missing}, unknown keys {unknown}")
        self._value: dict[str, Any] = value
        self._what = what

    def get(self, key: str, check: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return check(self._value[key], f"{self._what}.{key}", *args, **kwargs)

    def raw(self, key: str) -> Any:
        return self._value[key]
