"""The TXT record of a ``_peerd._tcp`` DNS-SD service: what peerd publishes and how a record
from the network is validated (RFC 6763 §6: key=value strings; ours are ``id``, ``fleet``,
``pv``, ``port``).

Pure: no sockets, no zeroconf. A record is hostile input (anyone on the LAN can publish one),
so every field is bounded and checked before use, and a bad one raises
:class:`MalformedRecordError` whose ``reason`` is the counter key discovery reports
(``peerd status`` rejects). :mod:`peerd.net.discovery` owns the service itself.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass

from peerd.protocol.limits import MAX_NODE_ID_LEN

#: Longest fleet id accepted from the network (ours is the hex of a 16-byte id).
MAX_FLEET_ID_LEN = 64
#: Protocol versions are small integers; a long digit string is an attack on int().
MAX_VERSION_DIGITS = 6

_B58_CHARS = frozenset("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz")
_FLEET_CHARS = frozenset(string.ascii_letters + string.digits + "-_.:")
REQUIRED_KEYS = (b"id", b"fleet", b"pv", b"port")



class MalformedRecordError(ValueError):
    """A TXT record from the network failed validation; ``reason`` is a counter key."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class TxtFields:
    node_id: str
    fleet_id: str
    protocol_version: int
    port: int


def _text(props: Mapping[bytes, bytes | None], key: bytes, max_len: int) -> str:
    raw = props.get(key)
    if raw is None:
        raise MalformedRecordError("missing_key")
    if len(raw) > max_len:
        raise MalformedRecordError("too_long")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedRecordError("bad_utf8") from None


def _small_int(text: str, lo: int, hi: int, reason: str) -> int:
    # isdigit() alone admits non-ASCII digits ("٣"), int() would accept " 3" or "+3".
    if not text or not text.isascii() or not text.isdigit():
        raise MalformedRecordError(reason)
    value = int(text)
    if not lo <= value <= hi:
        raise MalformedRecordError(reason)
    return value


def parse_txt(props: Mapping[bytes, bytes | None]) -> TxtFields:
    """Validate the TXT properties of a ``_peerd._tcp`` record (hostile input)."""
    if not isinstance(props, Mapping):
        raise MalformedRecordError("bad_txt")
    for key in REQUIRED_KEYS:
        if key not in props or props[key] is None:
            raise MalformedRecordError("missing_key")
    node_id = _text(props, b"id", MAX_NODE_ID_LEN)
    if len(node_id) < 32 or not set(node_id) <= _B58_CHARS:
        raise MalformedRecordError("bad_node_id")
    fleet_id = _text(props, b"fleet", MAX_FLEET_ID_LEN)
    if not fleet_id or not set(fleet_id) <= _FLEET_CHARS:
        raise MalformedRecordError("bad_fleet_id")
    version = _small_int(_text(props, b"pv", MAX_VERSION_DIGITS), 0, 10**6, "bad_version")
    port = _small_int(_text(props, b"port", 5), 1, 65535, "bad_port")
    return TxtFields(node_id, fleet_id, version, port)


def build_txt(node_id: str, fleet_id: str, port: int, protocol_version: int) -> dict[bytes, bytes]:
    props = {
        b"id": node_id.encode(),
        b"fleet": fleet_id.encode(),
        b"pv": str(protocol_version).encode(),
        b"port": str(port).encode(),
    }
    parse_txt(props)  # what we publish must pass our own validation
    return props
