"""Knowledge and keys entries (FedCache without a server): layouts, signing and admission.

Two typed entry kinds (:mod:`peerd.protocol.kinds`) share the weight entry's envelope,
frame and signed body; they differ in ``kind``, ``schema_id`` and the payload's tensors:

* **keys** (sent once, and again only when the samples change): ``keys`` float16
  ``[n, key_dim]`` (each row L2-normalised) and ``labels`` int16 ``[n]``. Row ``i`` is the
  origin's sample id ``i``. No version ledger: a keys entry is content-addressed, used only
  while a held knowledge entry of the same origin names its payload digest.
* **knowledge** (each round): ``ids`` int32 ``[m]`` (strictly increasing rows of the keys
  entry) and ``logits`` float16 ``[m, num_classes]``, plus ``keys_sha256`` in the signed
  body. It follows the weight entry's rules: the origin's ledger (newer versions only, no
  equivocation, bounded by time), staleness, newest per origin, capacity.

**Views** (issue 17, cordial learning) are knowledge entries under a *view schema*
(``view_ids > 0``): the same kind, envelope, ledger, staleness and capacity, another layout.
``ids`` int32 ``[m]`` name samples of the fleet-wide **shared index** (ids in
``[0, view_ids)``, every node computes the index offline from the same seed, so nothing about
the samples travels) and ``vectors`` float16 ``[m, key_dim]`` are the origin's per-sample
vectors for them (cordial learning's embedded outputs h_i). A view entry refers to no keys
entry: its ``keys_sha256`` carries the view schema's id (the schema names the shared index),
and a keys entry in a view fleet is SCHEMA_MISMATCH.

An origin's versions are one sequence over all its kinds, so ``(origin, version)`` still
names one entry in a Want. ``schema_id`` is the :class:`KnowledgeSchema`'s id (key width,
classes, encoder), never a model's: nodes with different architectures share a fleet, and a
node refuses an entry of another knowledge schema as SCHEMA_MISMATCH.

Admission runs the weight entry's steps 1-5 (:func:`peerd.protocol.admission.admit_head`),
then: kind and schema, sample count (before anything is read), the ledger (knowledge only),
the payload's length and index against the layout, its SHA-256, then the values (finite,
bounded logits, unit keys, labels in range, ids strictly increasing; for a view, ids
inside the shared index and bounded finite vectors). Pure numpy, no torch:
the caller turns the verified arrays into whatever its cache holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.core.reasons import Reason
from peerd.protocol.admission import admit_head, sha256_hex
from peerd.protocol.entry import EntryBody, SignedEntry, sign_entry
from peerd.protocol.errors import ProtocolError
from peerd.protocol.kinds import KEYS, KNOWLEDGE
from peerd.protocol.ledger import LedgerView, OriginLedger
from peerd.protocol.limits import (
    DEFAULT_MAX_CLOCK_SKEW_S,
    KEY_NORM_TOLERANCE,
    MAX_ENTRY_HEAD_LEN,
    MAX_KEY_DIM,
    MAX_KNOWLEDGE_CLASSES,
    MAX_KNOWLEDGE_SAMPLES,
    MAX_LOGIT_ABS,
    MAX_STR_LEN,
    MAX_VIEW_ABS,
    MAX_VIEW_IDS,
)
from peerd.protocol.manifest import Manifest
from peerd.protocol.messages import Entry
from peerd.protocol.tensors import (
    Schema,
    check_against_schema,
    decode_tensors,
    schema_payload_len,
)

__all__ = [
    "KnowledgeSchema",
    "VerifiedTyped",
    "admit_typed",
    "join_rows",
    "sign_keys",
    "sign_knowledge",
    "sign_view",
]

_SCHEMA_DOMAIN = b"peerd/knowledge-schema/v1\0"


@dataclass(frozen=True, slots=True)
class KnowledgeSchema:
    """What every node of a knowledge fleet must agree on (not the model): key width,
    classes (the label space) and the encoder that made the keys.

    ``encoder`` names the fleet's sample encoder and its settings (e.g.
    ``"random-projection/v1 1x28x28"``); the encoder's seed comes from the fleet id, which the
    envelope already binds. ``max_samples`` is the local bound on one entry's rows, checked
    before a payload is read; it is not part of the id.

    ``view_ids > 0`` makes it a *view schema* (module docstring): knowledge entries then carry
    ``vectors [m, key_dim]`` for ids of a shared index of ``view_ids`` samples, and
    ``num_classes`` is the task's label space (part of the id: nodes must agree on it).
    """

    key_dim: int
    num_classes: int
    encoder: str
    max_samples: int = MAX_KNOWLEDGE_SAMPLES
    view_ids: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.key_dim <= MAX_KEY_DIM:
            raise ValueError(f"key_dim must be in [1, {MAX_KEY_DIM}], got {self.key_dim}")
        if not 2 <= self.num_classes <= MAX_KNOWLEDGE_CLASSES:
            raise ValueError(
                f"num_classes must be in [2, {MAX_KNOWLEDGE_CLASSES}], got {self.num_classes}")
        if not 1 <= self.max_samples <= MAX_KNOWLEDGE_SAMPLES:
            raise ValueError(
                f"max_samples must be in [1, {MAX_KNOWLEDGE_SAMPLES}], got {self.max_samples}")
        if not self.encoder or len(self.encoder) > MAX_STR_LEN or "\n" in self.encoder:
            raise ValueError("encoder must be a non-empty single-line name")
        if not 0 <= self.view_ids <= MAX_VIEW_IDS:
            raise ValueError(f"view_ids must be in [0, {MAX_VIEW_IDS}], got {self.view_ids}")

    @property
    def views(self) -> bool:
        """A view schema: knowledge entries carry per-sample vectors of a shared index."""
        return self.view_ids > 0

    @property
    def id(self) -> str:
        """The ``schema_id`` of every knowledge and keys entry of this schema (hex)."""
        h = hashlib.sha256(_SCHEMA_DOMAIN)
        h.update(f"{self.key_dim}\n{self.num_classes}\n{self.encoder}\n".encode())
        if self.views:  # FedCache schemas keep the id they always had
            h.update(f"views\n{self.view_ids}\n".encode())
        return h.hexdigest()

    def layout(self, kind: str, samples: int) -> Schema:
        """The payload's tensors for ``samples`` rows: name -> (wire dtype, shape)."""
        if kind == KNOWLEDGE and self.views:
            return {"ids": ("int32", (samples,)),
                    "vectors": ("float16", (samples, self.key_dim))}
        if kind == KEYS and self.views:
            raise ValueError("a view schema has no keys entries")
        if kind == KNOWLEDGE:
            return {"ids": ("int32", (samples,)), "logits": ("float16", (samples,
                                                                          self.num_classes))}
        if kind == KEYS:
            return {"keys": ("float16", (samples, self.key_dim)), "labels": ("int16", (samples,))}
        raise ValueError(f"{kind!r} is not a knowledge kind")

    def frame_limit(self) -> int:
        """Largest entry frame of this schema: what a receiver's FrameDecoder allows."""
        kinds = (KNOWLEDGE,) if self.views else (KNOWLEDGE, KEYS)
        largest = max(schema_payload_len(self.layout(k, self.max_samples)) for k in kinds)
        return largest + MAX_ENTRY_HEAD_LEN


@dataclass(frozen=True, slots=True)
class VerifiedTyped:
    """A typed entry that passed every check; ``tensors`` are read-only views of the payload
    and ``message`` relays it untouched."""

    body: EntryBody
    tensors: dict[str, npt.NDArray[Any]]
    message: Entry


def sign_keys(
    key: Ed25519PrivateKey, fleet_id: bytes, *, schema: KnowledgeSchema, version: int,
    created_at: float, keys: npt.NDArray[Any], labels: npt.NDArray[Any],
) -> SignedEntry:
    """Sign an origin's sample keys (rows L2-normalised by the caller) and their labels."""
    n = len(labels)
    k16 = np.ascontiguousarray(keys, dtype="<f2")
    l16 = np.ascontiguousarray(labels, dtype="<i2")
    if k16.shape != (n, schema.key_dim) or l16.shape != (n,):
        raise ValueError(f"keys {k16.shape} / labels {l16.shape} do not fit key_dim "
                         f"{schema.key_dim}")
    _check_rows(n, schema)
    _check_keys({"keys": k16, "labels": l16}, schema)
    return sign_entry(key, fleet_id, version=version, created_at=created_at,
                      schema_id=schema.id, num_examples=n, tensors={"keys": k16, "labels": l16},
                      kind=KEYS)


def sign_knowledge(
    key: Ed25519PrivateKey, fleet_id: bytes, *, schema: KnowledgeSchema, version: int,
    created_at: float, ids: npt.NDArray[Any], logits: npt.NDArray[Any], keys_digest: str,
    group: str | None = None,
) -> SignedEntry:
    """Sign an origin's logits for the samples ``ids`` of the keys entry ``keys_digest``;
    ``group``: the origin's cache group, as for a weight entry (keys entries carry none:
    they are held beside the knowledge entry that names them, never counted by the cache)."""
    return _sign_rows(key, fleet_id, schema=schema, version=version, created_at=created_at,
                      ids=ids, name="logits", rows=logits, width=schema.num_classes,
                      check=_check_knowledge, keys_digest=keys_digest, group=group)


def sign_view(
    key: Ed25519PrivateKey, fleet_id: bytes, *, schema: KnowledgeSchema, version: int,
    created_at: float, ids: npt.NDArray[Any], vectors: npt.NDArray[Any],
    group: str | None = None,
) -> SignedEntry:
    """Sign an origin's vectors for the shared-index samples ``ids`` (a view schema's
    knowledge entry; its ``keys_sha256`` is the schema's id)."""
    if not schema.views:
        raise ValueError("sign_view needs a view schema (view_ids > 0)")
    return _sign_rows(key, fleet_id, schema=schema, version=version, created_at=created_at,
                      ids=ids, name="vectors", rows=vectors, width=schema.key_dim,
                      check=_check_view, keys_digest=schema.id, group=group)


def _sign_rows(
    key: Ed25519PrivateKey, fleet_id: bytes, *, schema: KnowledgeSchema, version: int,
    created_at: float, ids: npt.NDArray[Any], name: str, rows: npt.NDArray[Any], width: int,
    check: Callable[[dict[str, npt.NDArray[Any]], KnowledgeSchema], None],
    keys_digest: str, group: str | None,
) -> SignedEntry:
    """Sign int32 ``ids`` and float16 ``rows`` [m, width] under the tensor name ``name``,
    checked by the layout's own ``check`` (what admission will check) before signing."""
    i32 = np.ascontiguousarray(ids, dtype="<i4")
    f16 = np.ascontiguousarray(rows, dtype="<f2")
    m = len(i32)
    if f16.shape != (m, width):
        raise ValueError(f"{name} {f16.shape}, need ({m}, {width})")
    _check_rows(m, schema)
    tensors = {"ids": i32, name: f16}
    check(tensors, schema)
    return sign_entry(key, fleet_id, version=version, created_at=created_at,
                      schema_id=schema.id, num_examples=m, tensors=tensors,
                      kind=KNOWLEDGE, keys_digest=keys_digest, group=group)


def admit_typed(
    message: Entry,
    *,
    fleet_id: bytes,
    manifest: Manifest,
    ledger: OriginLedger | LedgerView,
    schema: KnowledgeSchema,
    now: float,
    max_skew: float = DEFAULT_MAX_CLOCK_SKEW_S,
    record: bool = True,
    sha256: Callable[[bytes | bytearray | memoryview], str] = sha256_hex,
) -> VerifiedTyped:
    """Admit a knowledge or keys entry (module docstring's order); a knowledge entry is
    recorded in the ledger on success when ``record`` (a live :class:`OriginLedger`)."""
    if record and not isinstance(ledger, OriginLedger):
        raise TypeError("record=True needs an OriginLedger, not a snapshot of one")
    body = admit_head(message, fleet_id=fleet_id, manifest=manifest, now=now, max_skew=max_skew)
    if body.kind not in (KNOWLEDGE, KEYS):
        raise ProtocolError(Reason.SCHEMA_MISMATCH, f"a {body.kind} entry in a knowledge fleet")
    if body.kind == KEYS and body.group is not None:
        # Keys entries carry no group (docs/protocol.md): one that does claims a place in a
        # group's quota it can never take, and no peerd node signs it.
        raise ProtocolError(Reason.KEYS_GROUP, f"a keys entry naming group {body.group!r}")
    if body.schema_id != schema.id:
        raise ProtocolError(Reason.SCHEMA_MISMATCH,
                            f"knowledge schema {body.schema_id[:12]}… != local {schema.id[:12]}…")
    if schema.views and (body.kind != KNOWLEDGE or body.keys_digest != schema.id):
        raise ProtocolError(Reason.SCHEMA_MISMATCH,
                            "a view fleet's entries are knowledge entries naming its schema")
    _check_rows(body.num_examples, schema)  # before the layout's size is even computed
    if body.kind == KNOWLEDGE:
        ledger.check(body.origin, body.version, body.digest, body.created_at)
    layout = schema.layout(body.kind, body.num_examples)
    expected_len = schema_payload_len(layout)
    if body.payload_len != expected_len:
        raise ProtocolError(
            Reason.TOO_LARGE if body.payload_len > expected_len else Reason.PAYLOAD_MISMATCH,
            f"signed payload length {body.payload_len}, {body.num_examples} rows need "
            f"{expected_len}")
    check_against_schema(body.tensors, layout)
    payload = message.payload
    if len(payload) != body.payload_len:
        raise ProtocolError(Reason.PAYLOAD_MISMATCH,
                            f"payload is {len(payload)} bytes, the signed body says "
                            f"{body.payload_len}")
    if sha256(payload) != body.digest:
        raise ProtocolError(Reason.PAYLOAD_MISMATCH, "payload SHA-256 differs from the signed one")
    tensors = decode_tensors(body.tensors, payload)
    if body.kind == KNOWLEDGE:
        (_check_view if schema.views else _check_knowledge)(tensors, schema)
        if record and isinstance(ledger, OriginLedger):
            ledger.record(body.origin, body.version, body.digest, body.created_at)
    else:
        _check_keys(tensors, schema)
    return VerifiedTyped(body=body, tensors=tensors, message=message)


def join_rows(
    keys: dict[str, npt.NDArray[Any]], knowledge: dict[str, npt.NDArray[Any]]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """The rows a knowledge entry names, from its keys entry: ``(keys [m, d] float32,
    labels [m] int64, logits [m, C] float32)``, fresh arrays. PAYLOAD_MISMATCH when an id
    is beyond the keys entry (the origin referenced the wrong keys)."""
    ids = knowledge["ids"]
    rows = len(keys["labels"])
    if len(ids) and int(ids[-1]) >= rows:
        raise ProtocolError(Reason.PAYLOAD_MISMATCH,
                            f"sample id {int(ids[-1])} beyond the keys entry's {rows} rows")
    return (keys["keys"][ids].astype(np.float32), keys["labels"][ids].astype(np.int64),
            knowledge["logits"].astype(np.float32))


def _check_rows(samples: int, schema: KnowledgeSchema) -> None:
    if samples < 1:
        raise ProtocolError(Reason.EXAMPLES_NONPOSITIVE, f"{samples} samples")
    if samples > schema.max_samples:
        raise ProtocolError(Reason.TOO_LARGE, f"{samples} samples, limit {schema.max_samples}")


def _check_knowledge(t: dict[str, npt.NDArray[Any]], schema: KnowledgeSchema) -> None:
    ids = t["ids"]
    if ids[0] < 0 or (len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1]))):
        raise ProtocolError(Reason.MALFORMED, "sample ids must be >= 0 and strictly increasing")
    if int(ids[-1]) >= schema.max_samples:
        raise ProtocolError(Reason.TOO_LARGE, f"sample id {int(ids[-1])} beyond the row limit")
    logits = t["logits"].astype(np.float32)
    if not bool(np.isfinite(logits).all()):
        raise ProtocolError(Reason.NON_FINITE, "NaN or Inf in the logits")
    if float(np.abs(logits).max()) > MAX_LOGIT_ABS:
        raise ProtocolError(Reason.NORM_TOO_LARGE, f"a logit beyond ±{MAX_LOGIT_ABS:g}")


def _check_view(t: dict[str, npt.NDArray[Any]], schema: KnowledgeSchema) -> None:
    ids = t["ids"]
    if ids[0] < 0 or (len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1]))):
        raise ProtocolError(Reason.MALFORMED, "sample ids must be >= 0 and strictly increasing")
    if int(ids[-1]) >= schema.view_ids:
        raise ProtocolError(Reason.TOO_LARGE,
                            f"sample id {int(ids[-1])} beyond the shared index's "
                            f"{schema.view_ids}")
    vectors = t["vectors"].astype(np.float32)
    if not bool(np.isfinite(vectors).all()):
        raise ProtocolError(Reason.NON_FINITE, "NaN or Inf in the vectors")
    if float(np.abs(vectors).max()) > MAX_VIEW_ABS:
        raise ProtocolError(Reason.NORM_TOO_LARGE, f"a vector value beyond ±{MAX_VIEW_ABS:g}")


def _check_keys(t: dict[str, npt.NDArray[Any]], schema: KnowledgeSchema) -> None:
    labels = t["labels"]
    if int(labels.min()) < 0 or int(labels.max()) >= schema.num_classes:
        raise ProtocolError(Reason.MALFORMED, f"a label outside [0, {schema.num_classes})")
    keys = t["keys"].astype(np.float32)
    if not bool(np.isfinite(keys).all()):
        raise ProtocolError(Reason.NON_FINITE, "NaN or Inf in the keys")
    norms = np.sqrt(np.einsum("ij,ij->i", keys, keys))
    if float(np.abs(norms - 1.0).max()) > KEY_NORM_TOLERANCE:
        raise ProtocolError(Reason.NORM_TOO_LARGE, "a key is not L2-normalised")
