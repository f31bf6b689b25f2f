"""Signed model-cache entries: the body that is signed, and building one from tensors.

The body carries everything a receiver must trust about an entry: type, fleet id, origin,
version, created_at, schema id, num_examples, the tensor index and the payload's SHA-256
and length. Provenance (who relayed it, when it arrived) is deliberately *not* signed:
relays forward the origin's envelope untouched.

Must not verify (``admission.py`` does) nor write to the tensors it signs: the payload
parts alias the caller's arrays wherever their layout allows it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.protocol.envelope import ENTRY_DOMAIN, SignedEnvelope
from peerd.protocol.frames import frame_parts
from peerd.protocol.identity import as_node_id, node_id_of
from peerd.protocol.limits import DIGEST_LEN, FLEET_ID_LEN, MAX_BIN_LEN
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

    def to_bytes(self) -> bytes:
        return pack(
            {
                "type": ENTRY_TYPE,
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
        f = Fields(unpack_exact(body, MAX_BIN_LEN), "entry body", _KEYS)
        if f.raw("type") != ENTRY_TYPE:
            malformed("entry body has the wrong type tag")
        payload_len = f.get("payload_len", as_int)
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
) -> SignedEntry:
    """Hash the tensors in wire layout and sign the body; the tensors are not copied."""
    index, parts = tensor_views(tensors, bfloat16)
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
    )
    envelope = SignedEnvelope.sign(key, ENTRY_DOMAIN, fleet_id, body.to_bytes())
    return SignedEntry(envelope, body, parts)
