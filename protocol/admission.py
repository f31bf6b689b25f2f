"""Admitting an Entry: every check, cheapest and most decisive first.

Order (each step only runs if the previous passed):
 1. envelope fleet id == ours                                   WRONG_FLEET
 2. signer key -> node id; revoked / member / expired            REVOKED, NOT_MEMBER, EXPIRED
 3. Ed25519 over domain || fleet || *raw* body bytes             BAD_SIGNATURE
 4. decode and type-check the body; body fleet and origin match   MALFORMED, WRONG_FLEET
    (a typed entry, peerd.protocol.kinds, is SCHEMA_MISMATCH here:  SCHEMA_MISMATCH
    peerd.protocol.knowledge admits those, after the same 1-5)
 5. created_at <= now + max_skew                                  FUTURE_TIMESTAMP
 6. ledger: newer than held, no equivocation, bounded by time    NOT_NEWER, EQUIVOCATION,
                                                                  VERSION_TOO_HIGH
 7. payload length == signed length == local schema's bytes       PAYLOAD_MISMATCH / TOO_LARGE
    (in the codecs the index names) and index matches the schema  SHAPE/DTYPE_MISMATCH
 8. SHA-256 of the payload == signed digest                       PAYLOAD_MISMATCH
 9. zero-copy tensor views; encoded tensors decoded to float32   MALFORMED, BAD_ENCODING
Membership is checked before the signature so strangers cost a dictionary lookup, and
the ledger before hashing so a replayed 44 MB entry costs no hash. In a worker thread the
ledger is a :class:`LedgerView` snapshot: nothing is recorded or flagged there (an
equivocation is raised as :class:`EquivocationError` for the ledger's owner to flag).

Must not: check finite values or the norm (``peerd.core.validate`` does, called from
``peerd.node.state.verify``), cache or weigh an entry (``peerd.core.cache`` and ``alpha``),
or read a file: a mapped payload is hashed through the ``sha256`` callable passed in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from peerd.core.reasons import Reason
from peerd.protocol.entry import EntryBody
from peerd.protocol.envelope import ENTRY_DOMAIN
from peerd.protocol.errors import ProtocolError
from peerd.protocol.kinds import WEIGHTS
from peerd.protocol.ledger import LedgerView, OriginLedger
from peerd.protocol.limits import DEFAULT_MAX_CLOCK_SKEW_S, MAX_ENTRY_HEAD_LEN
from peerd.protocol.manifest import Manifest
from peerd.protocol.messages import Entry
from peerd.protocol.tensors import (
    Schema,
    check_against_schema,
    decode_tensors,
    expected_payload_len,
    schema_payload_len,
)


@dataclass(frozen=True, slots=True)
class VerifiedEntry:
    """An entry that passed every protocol check; ``message`` relays it untouched."""

    body: EntryBody
    tensors: dict[str, npt.NDArray[Any]]
    message: Entry


def entry_frame_limit(schema: Schema, head_limit: int | None = None) -> int:
    """``max_frame_len`` for a FrameDecoder on a connection carrying entries for ``schema``."""
    return schema_payload_len(schema) + (head_limit or MAX_ENTRY_HEAD_LEN)


def sha256_hex(payload: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(payload).hexdigest()


def admit_head(
    message: Entry, *, fleet_id: bytes, manifest: Manifest, now: float, max_skew: float
) -> EntryBody:
    """Steps 1-5, shared by every kind: fleet, membership, signature, body, created_at."""
    env = message.envelope
    if env.fleet_id != fleet_id:
        raise ProtocolError(Reason.WRONG_FLEET, "entry signed for another fleet")
    member = manifest.member_by_key(env.key, now)
    raw_body = env.verify(ENTRY_DOMAIN, fleet_id, expected_key=member.public_key)
    body = EntryBody.from_bytes(raw_body)
    if body.fleet_id != fleet_id:
        raise ProtocolError(Reason.WRONG_FLEET, "entry body names another fleet")
    if body.origin != member.node_id:
        # The key signed a body claiming someone else's origin: a member impersonating.
        raise ProtocolError(Reason.BAD_SIGNATURE, "entry origin differs from its signer")
    if body.created_at > now + max_skew:
        raise ProtocolError(
            Reason.FUTURE_TIMESTAMP, f"created_at {body.created_at} > now {now} + {max_skew}"
        )
    return body


def admit_entry(
    message: Entry,
    *,
    fleet_id: bytes,
    manifest: Manifest,
    ledger: OriginLedger | LedgerView,
    schema: Schema,
    now: float,
    max_skew: float = DEFAULT_MAX_CLOCK_SKEW_S,
    record: bool = True,
    sha256: Callable[[bytes | bytearray | memoryview], str] = sha256_hex,
) -> VerifiedEntry:
    """Run every check in the module docstring's order; record in the ledger on success.

    ``sha256`` hashes the payload (hex). The default does it in one call; a caller whose
    payload is a mapped file passes one that reads it in pieces and lets each go.
    ``record`` needs a live :class:`OriginLedger` (a snapshot records nothing).
    """
    if record and not isinstance(ledger, OriginLedger):
        raise TypeError("record=True needs an OriginLedger, not a snapshot of one")
    body = admit_head(message, fleet_id=fleet_id, manifest=manifest, now=now, max_skew=max_skew)
    if body.kind != WEIGHTS:
        # A knowledge fleet's entry reaching a weight-mode node: not a model it can blend.
        raise ProtocolError(Reason.SCHEMA_MISMATCH,
                            f"a {body.kind} entry, this node blends weights")
    ledger.check(body.origin, body.version, body.digest, body.created_at)
    # An encoded entry is smaller than its raw form, never larger: the raw length bounds all.
    expected_len = expected_payload_len(schema, body.tensors)
    if body.payload_len != expected_len:
        raise ProtocolError(
            Reason.TOO_LARGE if body.payload_len > schema_payload_len(schema)
            else Reason.PAYLOAD_MISMATCH,
            f"signed payload length {body.payload_len}, local schema needs {expected_len}",
        )
    check_against_schema(body.tensors, schema)
    payload = message.payload
    if len(payload) != body.payload_len:
        raise ProtocolError(
            Reason.PAYLOAD_MISMATCH,
            f"payload is {len(payload)} bytes, the signed body says {body.payload_len}",
        )
    if sha256(payload) != body.digest:
        raise ProtocolError(Reason.PAYLOAD_MISMATCH, "payload SHA-256 differs from the signed one")
    tensors = decode_tensors(body.tensors, payload)
    if record and isinstance(ledger, OriginLedger):
        ledger.record(body.origin, body.version, body.digest, body.created_at)
    return VerifiedEntry(body=body, tensors=tensors, message=message)
