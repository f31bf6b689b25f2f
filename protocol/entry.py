"""Signed model-cache entries: the body that is signed, and building one from tensors.

The body carries everything a receiver must trust about an entry: type, fleet id, origin,
version, created_at, schema id, num_examples, the tensor index and the payload's SHA-256
and length; for a typed entry (:mod:`peerd.protocol.kinds`) also its ``kind`` and, for a
knowledge entry, the payload digest of the keys entry it refers to. A weight entry carries no
``kind`` key, so its bytes are unchanged from before kinds existed. An entry of a node with a
``[learning] group`` also carries ``group`` (the label the cache's per-group quota counts,
:func:`group_problem` says which labels are valid); without one the key is absent and the
bytes are those of before groups existed. Provenance (who relayed
it, when it arrived) is deliberately *not* signed: relays forward the origin's envelope
untouched.

Must not verify (``admission.py`` does) nor write to the tensors it signs: the payload
parts alias the caller's arrays wherever their layout allows it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.protocol.encoding import RAW, Encoding
from peerd.protocol.envelope import ENTRY_DOMAIN, SignedEnvelope
from peerd.protocol.frames import frame_parts
from peerd.protocol.identity import as_node_id, node_id_of
from peerd.protocol.kinds import KNOWLEDGE, TYPED_KINDS, WEIGHTS
from peerd.protocol.limits import (
    DIGEST_LEN,
    FLEET_ID_LEN,
    GROUP_CHARS,
    MAX_BIN_LEN,
    MAX_GROUP_LEN,
)
from peerd.protocol.messages import Entry
from peerd.protocol.tensors import TensorIndexItem, index_from_wire, tensor_views
from peerd.protocol.wire import (
    Fields,
    as_bytes,
    as_float,
    as_int,
    malformed,
    pack,
    unpack_exact,
)

ENTRY_TYPE = "entry"
_KEYS = frozenset(
    {
        "type",
        "fleet",
        "origin",
        "version",
        "created_at",
        "schema_id",
        "num_examples",
        "tensors",
        "payload_sha256",
        "payload_len",
    }
)
#: A typed body: the weight keys plus its kind; a knowledge body also names its keys entry.
_TYPED_KEYS = _KEYS | {"kind"}
_KNOWLEDGE_KEYS = _TYPED_KEYS | {"keys_sha256"}
_GROUP_RE = re.compile(f"{GROUP_CHARS}{{1,{MAX_GROUP_LEN}}}")


def group_problem(value: object) -> str | None:
    """Why ``value`` is no group label (None when it is one): a string of 1 to
    MAX_GROUP_LEN characters from GROUP_CHARS (protocol/limits.py names the threats)."""
    if type(value) is not str:
        return f"must be a string, got {type(value).__name__}"
    if not 1 <= len(value) <= MAX_GROUP_LEN:
        return f"must be 1 to {MAX_GROUP_LEN} characters, got {len(value)}"
    if _GROUP_RE.fullmatch(value) is None:
        return "may hold only ASCII letters, digits and . _ : -"
    return None


def _hex32(value: str, what: str) -> bytes:
    raw = bytes.fromhex(value)
    if len(raw) != DIGEST_LEN or raw.hex() != value:
        raise ValueError(f"{what} must be {2 * DIGEST_LEN} lowercase hex characters")
    return raw


@dataclass(frozen=True, slots=True)
class EntryBody:
    """The signed metadata of an entry; names match ``peerd.core``'s ``EntryMeta``.

    ``schema_id`` and ``digest`` are lowercase hex here (as in the core) and 32 raw bytes on
    the wire.
    """

    fleet_id: bytes
    origin: str
    version: int
    created_at: float
    schema_id: str
    num_examples: int
    tensors: tuple[TensorIndexItem, ...]
    digest: str
    payload_len: int
    #: What the payload is (peerd.protocol.kinds); never written for weights.
    kind: str = WEIGHTS
    #: Knowledge entries only: the payload SHA-256 (hex) of the origin's keys entry whose
    #: rows the ``ids`` name. None for every other kind.
    keys_digest: str | None = None
    #: The origin's cache group (``[learning] group``); None: no ``group`` key on the wire.
    group: str | None = None

    def __post_init__(self) -> None:
        if self.kind != WEIGHTS and self.kind not in TYPED_KINDS:
            raise ValueError(f"unknown entry kind {self.kind!r}")
        if (self.kind == KNOWLEDGE) != (self.keys_digest is not None):
            raise ValueError("a knowledge entry, and only one, names its keys entry")
        if self.group is not None and (problem := group_problem(self.group)) is not None:
            raise ValueError(f"group {str(self.group)[:MAX_GROUP_LEN]!r} {problem}")

    def to_bytes(self) -> bytes:
        typed: dict[str, object] = {}
        if self.kind != WEIGHTS:
            typed["kind"] = self.kind
        if self.keys_digest is not None:
            typed["keys_sha256"] = _hex32(self.keys_digest, "keys_digest")
        if self.group is not None:
            typed["group"] = self.group
        return pack(
            {
                "type": ENTRY_TYPE,
                **typed,
                "fleet": self.fleet_id,
                "origin": self.origin,
                "version": self.version,
                "created_at": float(self.created_at),
                "schema_id": _hex32(self.schema_id, "schema_id"),
                "num_examples": self.num_examples,
                "tensors": [item.to_wire() for item in self.tensors],
                "payload_sha256": _hex32(self.digest, "digest"),
                "payload_len": self.payload_len,
            }
        )

    @classmethod
    def from_bytes(cls, body: bytes) -> EntryBody:
        raw = unpack_exact(body, MAX_BIN_LEN)
        # The key set follows the kind; "weights" is never spelled out (one encoding per
        # body), and an unknown kind is malformed rather than skipped.
        kind = WEIGHTS
        if type(raw) is dict and "kind" in raw:
            kind = raw["kind"]
            if type(kind) is not str or kind not in TYPED_KINDS:
                malformed(f"entry kind {str(kind)[:32]!r} is unknown")
        keys = _KEYS if kind == WEIGHTS else _KNOWLEDGE_KEYS if kind == KNOWLEDGE else _TYPED_KEYS
        grouped = type(raw) is dict and "group" in raw
        f = Fields(raw, "entry body", keys | {"group"} if grouped else keys)
        if f.raw("type") != ENTRY_TYPE:
            malformed("entry body has the wrong type tag")
        payload_len = f.get("payload_len", as_int)
        keys_digest = None
        if kind == KNOWLEDGE:
            keys_digest = f.get("keys_sha256", as_bytes, DIGEST_LEN).hex()
        group = None
        if grouped:
            group = f.raw("group")
            if (problem := group_problem(group)) is not None:
                malformed(f"entry body.group {problem}")
        return cls(
            fleet_id=f.get("fleet", as_bytes, FLEET_ID_LEN),
            origin=f.get("origin", as_node_id),
            version=f.get("version", as_int),
            created_at=f.get("created_at", as_float),
            schema_id=f.get("schema_id", as_bytes, DIGEST_LEN).hex(),
            num_examples=f.get("num_examples", as_int),
            tensors=index_from_wire(f.raw("tensors"), payload_len),
            digest=f.get("payload_sha256", as_bytes, DIGEST_LEN).hex(),
            payload_len=payload_len,
            kind=kind,
            keys_digest=keys_digest,
            group=group,
        )


@dataclass(frozen=True, slots=True)
class SignedEntry:
    """What an origin produces: the envelope, its decoded body and the payload as views of
    the origin's own tensors (written with a vectored send, never joined)."""

    envelope: SignedEnvelope
    body: EntryBody
    parts: tuple[memoryview, ...]

    def to_wire_parts(self) -> list[bytes | memoryview]:
        """[length prefix, msgpack head, tensor, tensor, ...] for ``sendmsg``/``writelines``."""
        head = Entry(self.envelope, b"").head()
        return frame_parts([head, *self.parts])

    def to_message(self) -> Entry:
        """As a received Entry would look (joins the payload: one copy; tests, loopback)."""
        return Entry(self.envelope, b"".join(self.parts))


def sign_entry(
    key: Ed25519PrivateKey,
    fleet_id: bytes,
    *,
    version: int,
    created_at: float,
    schema_id: str,
    num_examples: int,
    tensors: Mapping[str, npt.NDArray[Any]],
    bfloat16: frozenset[str] = frozenset(),
    kind: str = WEIGHTS,
    keys_digest: str | None = None,
    group: str | None = None,
    encoding: Encoding = RAW,
) -> SignedEntry:
    """Hash the tensors in wire layout and sign the body; the tensors are not copied.
    ``kind``/``keys_digest``: a typed entry (peerd.protocol.knowledge builds those);
    ``group``: the origin's cache group, signed with the rest (None: no ``group`` key);
    ``encoding``: float32 tensors in that codec (peerd.protocol.encoding; encoded copies),
    the digest and signature over the encoded bytes."""
    index, parts = tensor_views(tensors, bfloat16, encoding)
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    body = EntryBody(
        fleet_id=fleet_id,
        origin=node_id_of(key),
        version=version,
        created_at=created_at,
        schema_id=schema_id,
        num_examples=num_examples,
        tensors=index,
        digest=digest.hexdigest(),
        payload_len=sum(len(p) for p in parts),
        kind=kind,
        keys_digest=keys_digest,
        group=group,
    )
    envelope = SignedEnvelope.sign(key, ENTRY_DOMAIN, fleet_id, body.to_bytes())
    return SignedEntry(envelope, body, parts)
