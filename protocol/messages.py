"""The seven wire messages and the one function that turns a frame into one of them.

Every frame body is a msgpack map ``{"type": str, "v": int, ...}``. An Entry frame is the
one exception to "exactly one msgpack object": its map is followed by the raw tensor
payload (whose length the signed body states), so that 44 MB of parameters are hashed and
viewed in place instead of being copied out of a msgpack ``bin``. Every other frame must be
at most :data:`MAX_CONTROL_FRAME_LEN` bytes (a Manifest :data:`MAX_MANIFEST_FRAME_LEN`) and
contain nothing after its map.

Decoding checks form only: it never verifies a signature (``admission``, ``manifest``) and
never decides when a message may come (``session``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from peerd.core.reasons import Reason
from peerd.protocol.envelope import SignedEnvelope, check_version
from peerd.protocol.errors import ProtocolError
from peerd.protocol.frames import frame_parts
from peerd.protocol.identity import as_node_id
from peerd.protocol.kinds import TYPED_KINDS, WEIGHTS
from peerd.protocol.limits import (
    DIGEST_LEN,
    FLEET_ID_LEN,
    MAX_ADDR_RECORDS,
    MAX_CAPABILITIES,
    MAX_CAPABILITY_LEN,
    MAX_CONTROL_FRAME_LEN,
    MAX_DIGEST_ITEMS,
    MAX_ENTRY_HEAD_LEN,
    MAX_ERROR_CODE_LEN,
    MAX_ERROR_TEXT_LEN,
    MAX_MANIFEST_FRAME_LEN,
    PROTOCOL_VERSION,
)
from peerd.protocol.wire import (
    Fields,
    as_bytes,
    as_float,
    as_int,
    as_list,
    as_str,
    malformed,
    pack,
    unpack_prefix,
)


class _Message:
    TYPE: ClassVar[str]
    _KEYS: ClassVar[frozenset[str]]

    def fields(self) -> dict[str, Any]:
        raise NotImplementedError

    def head(self) -> bytes:
        return pack({"type": self.TYPE, "v": PROTOCOL_VERSION, **self.fields()})

    def to_wire(self) -> bytes:
        """The complete frame (length prefix included)."""
        return b"".join(frame_parts([self.head()]))


@dataclass(frozen=True, slots=True)
class Hello(_Message):
    TYPE: ClassVar[str] = "hello"
    _KEYS: ClassVar[frozenset[str]] = frozenset({"fleet", "node", "manifest_seq", "caps"})
    fleet_id: bytes
    node_id: str
    manifest_seq: int
    capabilities: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        return {
            "fleet": self.fleet_id,
            "node": self.node_id,
            "manifest_seq": self.manifest_seq,
            "caps": list(self.capabilities),
        }

    @classmethod
    def from_fields(cls, f: Fields) -> Hello:
        caps = f.get("caps", as_list, MAX_CAPABILITIES)
        return cls(
            fleet_id=f.get("fleet", as_bytes, FLEET_ID_LEN),
            node_id=f.get("node", as_node_id),
            manifest_seq=f.get("manifest_seq", as_int),
            capabilities=tuple(as_str(c, "hello.caps[]", MAX_CAPABILITY_LEN) for c in caps),
        )


@dataclass(frozen=True, slots=True)
class DigestItem:
    origin: str
    version: int
    created_at: float
    digest: bytes  # raw 32-byte payload SHA-256
    #: The entry's kind (peerd.protocol.kinds): a fifth element on the wire, written only for
    #: typed entries, so a weights Digest is byte for byte what it was before kinds existed.
    kind: str = WEIGHTS

    def to_wire(self) -> list[Any]:
        row: list[Any] = [self.origin, self.version, float(self.created_at), self.digest]
        return row if self.kind == WEIGHTS else [*row, self.kind]


@dataclass(frozen=True, slots=True)
class Digest(_Message):
    """What the sender holds: one item per cached entry."""

    TYPE: ClassVar[str] = "digest"
    _KEYS: ClassVar[frozenset[str]] = frozenset({"entries"})
    entries: tuple[DigestItem, ...]

    def fields(self) -> dict[str, Any]:
        return {"entries": [e.to_wire() for e in self.entries]}

    @classmethod
    def from_fields(cls, f: Fields) -> Digest:
        items = []
        for i, raw in enumerate(f.get("entries", as_list, MAX_DIGEST_ITEMS)):
            what = f"digest.entries[{i}]"
            e = as_list(raw, what, 5)
            if len(e) not in (4, 5):
                malformed(f"{what} must have 4 or 5 items, got {len(e)}")
            kind = WEIGHTS
            if len(e) == 5:  # typed: the kind is spelled out, and "weights" never is
                kind = as_str(e[4], what + ".kind", 16)
                if kind not in TYPED_KINDS:
                    malformed(f"{what}.kind {kind!r} is unknown")
            items.append(
                DigestItem(
                    origin=as_node_id(e[0], what + ".origin"),
                    version=as_int(e[1], what + ".version"),
                    created_at=as_float(e[2], what + ".created_at"),
                    digest=as_bytes(e[3], what + ".digest", DIGEST_LEN),
                    kind=kind,
                )
            )
        return cls(tuple(items))


@dataclass(frozen=True, slots=True)
class Want(_Message):
    """Which (origin, version) entries the sender asks for.

    ``offsets`` (empty, or one per item) are the payload bytes the asker already holds of
    each, from a transfer that was cut (:data:`RESUME_CAPABILITY`): the sender may send the
    rest only. An item with an offset travels as ``[origin, version, offset]``, offset > 0.
    """

    TYPE: ClassVar[str] = "want"
    _KEYS: ClassVar[frozenset[str]] = frozenset({"items"})
    items: tuple[tuple[str, int], ...]
    offsets: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.offsets and (len(self.offsets) != len(self.items)
                             or any(o < 0 for o in self.offsets)):
            raise ValueError("offsets: one non-negative offset per item")

    def offset_of(self, origin: str, version: int) -> int:
        """What the asker holds of that entry's payload already (0: ask for all of it)."""
        for item, offset in zip(self.items, self.offsets, strict=False):
            if item == (origin, version):
                return offset
        return 0

    @property
    def resumes(self) -> bool:
        return any(self.offsets)

    def fields(self) -> dict[str, Any]:
        offsets = self.offsets or (0,) * len(self.items)
        return {"items": [[origin, version, offset] if offset else [origin, version]
                          for (origin, version), offset in zip(self.items, offsets,
                                                               strict=True)]}

    @classmethod
    def from_fields(cls, f: Fields) -> Want:
        items, offsets = [], []
        for i, raw in enumerate(f.get("items", as_list, MAX_DIGEST_ITEMS)):
            item = as_list(raw, f"want.items[{i}]", 3)
            if len(item) < 2:
                malformed(f"want.items[{i}] needs an origin and a version")
            items.append((as_node_id(item[0], "want.origin"), as_int(item[1], "want.version")))
            offset = as_int(item[2], "want.offset") if len(item) == 3 else 0
            if len(item) == 3 and offset < 1:
                malformed(f"want.items[{i}]: an offset is at least 1 (leave it out for 0)")
            offsets.append(offset)
        return cls(tuple(items), tuple(offsets) if any(offsets) else ())


@dataclass(frozen=True, slots=True)
class ManifestMessage(_Message):
    TYPE: ClassVar[str] = "manifest"
    _KEYS: ClassVar[frozenset[str]] = frozenset({"envelope"})
    envelope: SignedEnvelope

    def fields(self) -> dict[str, Any]:
        return {"envelope": self.envelope.to_wire()}

    @classmethod
    def from_fields(cls, f: Fields) -> ManifestMessage:
        return cls(SignedEnvelope.from_wire(f.raw("envelope")))


@dataclass(frozen=True, slots=True)
class Addrs(_Message):
    """Signed address records of members (peerd.protocol.peerrecord), not yet verified.

    Sent only between peers that both announce :data:`ADDRS_CAPABILITY` in their Hello, so
    a peer of a release without it sees the session it always saw."""

    TYPE: ClassVar[str] = "addrs"
    _KEYS: ClassVar[frozenset[str]] = frozenset({"records"})
    records: tuple[SignedEnvelope, ...]

    def fields(self) -> dict[str, Any]:
        return {"records": [e.to_wire() for e in self.records]}

    @classmethod
    def from_fields(cls, f: Fields) -> Addrs:
        raw = f.get("records", as_list, MAX_ADDR_RECORDS)
        return cls(tuple(SignedEnvelope.from_wire(r) for r in raw))


#: The Hello capability that says a peer takes part in the address exchange (an Addrs turn).
ADDRS_CAPABILITY = "addrs/v1"
#: The Hello capability that says a peer asks for, and sends, the rest of a cut transfer
#: (a Want item's offset, an Entry's ``offset``): a 44 MB entry cut at 40 MB over a slow
#: link costs 4 MB to finish, not 44 again.
RESUME_CAPABILITY = "resume/v1"
#: The Hello capability that says a peer takes address records holding circuit addresses
#: (``.../p2p/<relay>/p2p-circuit``, issue 27): a release before them ends the session on
#: such a record (malformed), so it is sent only the records without one.
CIRCUITS_CAPABILITY = "circuits/v1"
#: The Hello capability that says a peer takes address records with the ``relay`` field
#: (``peerd.protocol.peerrecord``): a release before it ends the session on one
#: (malformed), so it is sent only the records without it.
RELAYREC_CAPABILITY = "relayrec/v1"


@dataclass(frozen=True, slots=True)
class Error(_Message):
    """Why the sender is closing or refusing (code is a Reason value or a version code)."""

    TYPE: ClassVar[str] = "error"
    _KEYS: ClassVar[frozenset[str]] = frozenset({"code", "text"})
    code: str
    text: str = ""

    def fields(self) -> dict[str, Any]:
        return {"code": self.code, "text": self.text}

    @classmethod
    def from_fields(cls, f: Fields) -> Error:
        code = f.get("code", as_str, MAX_ERROR_CODE_LEN)
        if not all(c.isascii() and (c.islower() or c.isdigit() or c == "_") for c in code):
            malformed("error code must be lowercase ascii, digits and '_'")
        return cls(code, f.get("text", as_str, MAX_ERROR_TEXT_LEN, 0))


@dataclass(frozen=True, slots=True)
class Entry(_Message):
    """A signed envelope plus the raw payload it commits to (not yet verified).

    With ``offset`` > 0 (only to a peer whose Want asked for it, :data:`RESUME_CAPABILITY`)
    ``payload`` is the signed payload's tail from that byte on: the rest of a transfer that
    was cut. The map then has the key ``offset``; the receiver joins the tail to the bytes
    it kept and verifies the whole entry as usual."""

    TYPE: ClassVar[str] = "entry"
    _KEYS: ClassVar[frozenset[str]] = frozenset({"envelope"})
    _RESUMED_KEYS: ClassVar[frozenset[str]] = frozenset({"envelope", "offset"})
    envelope: SignedEnvelope
    payload: bytes | bytearray | memoryview
    offset: int = 0

    def fields(self) -> dict[str, Any]:
        if self.offset:
            return {"envelope": self.envelope.to_wire(), "offset": self.offset}
        return {"envelope": self.envelope.to_wire()}

    def to_wire_parts(self) -> list[bytes | memoryview]:
        """Frame as [prefix, head, payload] for a vectored write: the payload is not copied."""
        return frame_parts([self.head(), memoryview(self.payload)])

    def to_wire(self) -> bytes:
        return b"".join(self.to_wire_parts())


Message = Hello | Digest | Want | Entry | ManifestMessage | Addrs | Error
_CONTROL: dict[str, Any] = {cls.TYPE: cls for cls in (Hello, Digest, Want, ManifestMessage, Addrs,
                                                      Error)}
#: Control messages allowed past MAX_CONTROL_FRAME_LEN: a fleet's member list may be longer.
_FRAME_LIMIT: dict[str, int] = {ManifestMessage.TYPE: MAX_MANIFEST_FRAME_LEN}


def decode_frame(frame: bytes | bytearray | memoryview) -> Message:
    """Decode one frame body (without its length prefix) into a typed message.

    Entry payloads are returned as a read-only view into ``frame`` (no copy); the caller
    verifies them with :func:`peerd.protocol.admission.admit_entry`.
    """
    view = memoryview(frame).toreadonly()
    try:
        head, head_len = unpack_prefix(view, MAX_ENTRY_HEAD_LEN)
    except ProtocolError:
        if len(view) > MAX_ENTRY_HEAD_LEN:  # no message head is this long: say so
            raise ProtocolError(Reason.TOO_LARGE, "message head exceeds the limit") from None
        raise
    if type(head) is not dict:
        malformed("message must be a msgpack map")
    msg_type = head.get("type")
    if type(msg_type) is not str:
        malformed("message has no type")
    # Too old and too new are distinct errors (the reply tells who has to upgrade).
    check_version(as_int(head.get("v"), "message.v"))
    body = {k: v for k, v in head.items() if k not in ("type", "v")}
    if msg_type == Entry.TYPE:
        resumed = "offset" in body
        f = Fields(body, "entry", Entry._RESUMED_KEYS if resumed else Entry._KEYS)
        offset = f.get("offset", as_int) if resumed else 0
        if resumed and offset < 1:
            malformed("entry.offset is at least 1 (leave it out for 0)")
        return Entry(SignedEnvelope.from_wire(f.raw("envelope")), view[head_len:], offset)
    cls = _CONTROL.get(msg_type)
    if cls is None:
        malformed(f"unknown message type {msg_type[:32]!r}")
    if len(view) > _FRAME_LIMIT.get(msg_type, MAX_CONTROL_FRAME_LEN):
        raise ProtocolError(Reason.TOO_LARGE, f"{msg_type} frame of {len(view)} bytes")
    if head_len != len(view):
        malformed(f"{len(view) - head_len} trailing bytes after a {msg_type} message")
    message: Message = cls.from_fields(Fields(body, msg_type, cls._KEYS))
    return message
