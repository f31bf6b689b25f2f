"""Typed dataclasses to JSON and back, naming every shape problem (the control API's codec).

The status (:mod:`peerd.control.status`) and the participation audit
(:mod:`peerd.control.audit`) are frozen dataclasses that *are* their schemas: a key's JSON
name is the field's name and keys appear in field order. :class:`Codec` derives the encoder
and the decoder of one such class from its annotations, once, at import.

JSON rules: tuples are lists, mappings are objects, an optional number that is NaN or
infinite is ``null`` (JSON has no spelling for them), unknown keys are ignored on decoding
(the documented contract: extra fields may appear), and numbers keep their JSON form (an
integral ``created_at`` stays an integer) so decoding and re-encoding gives back the same bytes.
A decoder collects every problem (``cache[2].alpha: expected a number, got a string``)
before raising :class:`StatusError` with all of them, so one reply shows what is wrong.

Pure and light: ``peerd status`` imports it without torch or libp2p.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Generic, Literal, TypeVar


class StatusError(ValueError):
    """A status, peers or audit document that does not have the schema's shape."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("malformed status: " + "; ".join(problems))
        self.problems = problems


def finite(x: float | None) -> float | None:
    """``x``, or None when it is missing, NaN or infinite (how an optional number is shown)."""
    return None if x is None or not math.isfinite(x) else x


T = TypeVar("T")
#: Decodes one JSON value found at a path; appends problems and returns _BAD on a bad shape.
_Decoder = Callable[[Any, str, list[str]], Any]
_Encoder = Callable[[Any], Any]
_BAD = object()


def what(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
             type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, int | float) else "?")


def _shaped(value: Any, kind: type[list[Any]] | type[dict[str, Any]], where: str,
            problems: list[str]) -> bool:
    """Whether ``value`` is a JSON list (or object); if not, the problem is noted."""
    if isinstance(value, kind):
        return True
    problems.append(f"{where}: expected {what(kind())}, got {what(value)}")
    return False


def _scalar(check: Callable[[Any], bool], expected: str) -> _Decoder:
    def decode(value: Any, where: str, problems: list[str]) -> Any:
        if check(value):
            return value
        problems.append(f"{where}: expected {expected}, got {what(value)}")
        return _BAD
    return decode


_SCALARS: dict[Any, _Decoder] = {
    # bool is an int to Python, never to the schema.
    int: _scalar(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    # Kept as parsed (an int stays an int) so that re-encoding gives back the same bytes.
    float: _scalar(lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
    str: _scalar(lambda v: isinstance(v, str), "a string"),
    bool: _scalar(lambda v: isinstance(v, bool), "a boolean"),
}


def _codec(tp: Any) -> tuple[_Decoder, _Encoder]:
    """The decoder and encoder of one annotated type (the forms the schema above uses)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in _SCALARS:
        return _SCALARS[tp], lambda v: v
    if origin is types.UnionType and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        dec, enc = _codec(inner)

        def opt(value: Any, where: str, problems: list[str]) -> Any:
            return None if value is None else dec(value, where, problems)

        if inner is float:
            return opt, finite
        return opt, lambda v: None if v is None else enc(v)
    if origin is Literal:
        return _scalar(lambda v: any(v == a and type(v) is type(a) for a in args),
                       " or ".join(map(repr, args))), lambda v: v
    if origin is tuple:
        dec, enc = _codec(args[0])

        def seq(value: Any, where: str, problems: list[str]) -> Any:
            if not _shaped(value, list, where, problems):
                return _BAD
            items = [dec(v, f"{where}[{i}]", problems) for i, v in enumerate(value)]
            return _BAD if _BAD in items else tuple(items)

        return seq, lambda v: [enc(x) for x in v]
    if origin is Mapping:
        dec, enc = _codec(args[1])

        def obj(value: Any, where: str, problems: list[str]) -> Any:
            if not _shaped(value, dict, where, problems):
                return _BAD
            items = {k: dec(v, f"{where}.{k}", problems) for k, v in value.items()}
            return _BAD if _BAD in items.values() else items

        return obj, lambda v: {k: enc(x) for k, x in v.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _record(tp)
    raise TypeError(f"no JSON codec for {tp!r}")


def _record(cls: type[Any]) -> tuple[_Decoder, _Encoder]:
    hints = typing.get_type_hints(cls)
    fields = [(f.name, *_codec(hints[f.name])) for f in dataclasses.fields(cls)]

    def decode(value: Any, where: str, problems: list[str]) -> Any:
        if not _shaped(value, dict, where or "status", problems):
            return _BAD
        out: dict[str, Any] = {}
        for name, dec, _ in fields:
            at = f"{where}.{name}" if where else name
            if name not in value:
                problems.append(f"{at}: missing")
            else:
                out[name] = dec(value[name], at, problems)
        if len(out) < len(fields) or _BAD in out.values():
            return _BAD
        return cls(**out)

    def encode(value: Any) -> dict[str, Any]:
        return {name: enc(getattr(value, name)) for name, _, enc in fields}

    return decode, encode


class Codec(Generic[T]):
    """The JSON codec of one dataclass ``cls`` (its fields' annotated types: int, float, str,
    bool, ``X | None``, Literal, ``tuple[X, ...]``, ``Mapping[str, X]`` and dataclasses)."""

    def __init__(self, cls: type[T]) -> None:
        self.cls = cls
        self._decode, self._encode = _record(cls)

    def to_json(self, value: T) -> dict[str, Any]:
        encoded: dict[str, Any] = self._encode(value)
        return encoded

    def from_json(self, obj: Any) -> T:
        """``obj`` decoded; :class:`StatusError` naming every shape problem."""
        problems: list[str] = []
        value = self._decode(obj, "", problems)
        if problems:
            raise StatusError(problems)
        assert isinstance(value, self.cls)
        return value

    def many_from_json(self, obj: Any, where: str) -> tuple[T, ...]:
        """A JSON list of them (found at ``where``); :class:`StatusError` naming every
        problem of every item."""
        problems: list[str] = []
        if not _shaped(obj, list, where, problems):
            raise StatusError(problems)
        items = [self._decode(v, f"{where}[{i}]", problems) for i, v in enumerate(obj)]
        if problems:
            raise StatusError(problems)
        return tuple(items)
