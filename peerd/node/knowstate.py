"""Knowledge mode's gossip state: knowledge entries in the cache, the keys they refer to beside.

A :class:`KnowledgeState` is a :class:`~peerd.node.state.NodeState` whose cache holds the
peers' **knowledge** entries (peerd.protocol.knowledge) under the same rules as models:
the ledger (newer versions only, equivocation), τ_max, newest per origin, capacity C and,
besides C, a capacity in samples (``sample_budget``). Each knowledge entry names a **keys**
entry of its origin by payload digest; those are held beside the cache, one per origin, for
exactly as long as a cached knowledge entry names them (never counted against C: they are
what the cached entries need). A keys entry nobody names is dropped as ``unreferenced``.

Wants follow that order: the knowledge entries a metadata merge would keep, then the keys
entries of origins whose knowledge we hold or are about to receive and whose keys we lack;
the asker's order is the sender's, so the knowledge entry arrives (and is verified) before
the keys entry it names.

Under a view schema (``KnowledgeSchema.view_ids > 0``, cordial learning) the cached knowledge
entries are peers' **views**: per-sample vectors for ids of the fleet's shared index, which
name no keys entry (there are none to want or hold); :meth:`KnowledgeState.views` hands them
to the round. Same ledger, τ_max, newest per origin, C and sample budget.

Like NodeState it reads no clock and does no I/O; verification (:func:`verify_typed`) runs
in a worker thread on snapshots taken on the loop thread. It holds no torch model and no
ANN index: :meth:`KnowledgeState.batches` hands the daemon's round the joined rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import partial
from typing import ClassVar

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.core.entry import CacheItem, Entry, EntryMeta
from peerd.core.reasons import Reason
from peerd.node.entryfile import EntryFile
from peerd.node.state import Held, NodeState, Withdrawn, meta_of
from peerd.node.wirearrays import from_wire_arrays
from peerd.protocol import messages as msg
from peerd.protocol.admission import sha256_hex
from peerd.protocol.entry import SignedEntry
from peerd.protocol.envelope import SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.kinds import KEYS, KNOWLEDGE
from peerd.protocol.knowledge import (
    KnowledgeSchema,
    VerifiedTyped,
    admit_typed,
    join_rows,
    sign_keys,
    sign_knowledge,
    sign_view,
)
from peerd.protocol.ledger import LedgerView
from peerd.protocol.manifest import Manifest
from peerd.protocol.tensors import decode_tensors


@dataclass(frozen=True, slots=True)
class TypedHeld(Held):
    """A held knowledge or keys entry; ``arrays`` are the verified numpy views of its payload
    and ``keys_digest`` is what a knowledge entry refers to (None for keys)."""

    arrays: dict[str, npt.NDArray[np.generic]] = field(default_factory=dict, repr=False)
    keys_digest: str | None = None


@dataclass(frozen=True, slots=True)
class Rows:
    """One peer's knowledge, joined with its keys: what the round's knowledge cache takes."""

    origin: str
    version: int
    created_at: float
    keys: npt.NDArray[np.float32]
    labels: npt.NDArray[np.int64]
    logits: npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class ViewRows:
    """One peer's view: its vectors ``[m, width]`` for the shared-index ``ids`` ``[m]``;
    ``group``: the cache group its origin signed (cordial mode: which agent it is)."""

    origin: str
    version: int
    created_at: float
    ids: npt.NDArray[np.int64]
    vectors: npt.NDArray[np.float32]
    group: str | None = None


def held_typed(v: VerifiedTyped) -> TypedHeld:
    meta = meta_of(v.body)
    entry = Entry(meta, from_wire_arrays(v.body.tensors, v.tensors))
    return TypedHeld(entry, v.message, None, arrays=v.tensors, keys_digest=v.body.keys_digest)


def verify_typed(
    message: msg.Entry, *, fleet_id: bytes, manifest: Manifest, ledger: LedgerView,
    schema: KnowledgeSchema, max_skew: float, now: float, frame: EntryFile | None = None,
) -> TypedHeld:
    """Admission of a knowledge or keys entry (peerd.protocol.knowledge.admit_typed);
    raises :class:`ProtocolError`. Pure on its snapshots: safe in a worker thread.

    A spooled frame is read into memory first: typed entries are kilobytes, and holding
    them in memory keeps a relay's copy independent of the spool's files."""
    if frame is not None:
        try:
            message = msg.Entry(message.envelope, bytes(message.payload))
        finally:
            frame.release()
    v = admit_typed(message, fleet_id=fleet_id, manifest=manifest, ledger=ledger, schema=schema,
                    now=now, max_skew=max_skew, record=False, sha256=sha256_hex)
    return held_typed(v)


def sign_typed(signed: SignedEntry) -> TypedHeld:
    """Our own freshly signed entry as held (the payload joined once, arrays views of it)."""
    message = signed.to_message()
    arrays = decode_tensors(signed.body.tensors, message.payload)
    entry = Entry(meta_of(signed.body), from_wire_arrays(signed.body.tensors, arrays))
    return TypedHeld(entry, message, None, arrays=arrays,
                     keys_digest=signed.body.keys_digest)


@dataclass
class KnowledgeState(NodeState):
    """NodeState for ``[learning] mode = "knowledge"`` (module docstring)."""

    knowledge: KnowledgeSchema = field(kw_only=True)
    #: origin -> its keys entry, while a cached knowledge entry of it names that digest.
    keys: dict[str, TypedHeld] = field(default_factory=dict)
    own_keys: TypedHeld | None = None
    #: Cordial mode's check of a view against the manifest (whom it binds to which agent):
    #: why a knowledge entry may not be held, or None. None: every entry may.
    view_check: Callable[[Manifest, EntryMeta], Reason | None] | None = None

    entry_kind: ClassVar[str] = KNOWLEDGE

    @classmethod
    def from_node(cls, base: NodeState, schema: KnowledgeSchema, *,
                  sample_budget: int) -> KnowledgeState:
        """``base`` (the state a daemon built for weights: its keys, manifest, ledger and
        counters) holding knowledge or views of ``schema`` instead."""
        node = cls(**{f.name: getattr(base, f.name) for f in fields(NodeState)},
                   knowledge=schema)
        node.sample_budget = sample_budget
        return node

    # -------------------------------------------------------------- what is held
    def holdings(self) -> list[Held]:
        """Own knowledge and keys first, then the cache (freshest first), then its keys."""
        own: list[Held] = [h for h in (self.own, self.own_keys) if h is not None]
        cached = [i.payload for i in self.cache if isinstance(i.payload, Held)]
        return own + cached + list(self.keys.values())

    def references(self) -> dict[str, str]:
        """origin -> the keys digest its cached knowledge entry names."""
        return {i.meta.origin: i.payload.keys_digest for i in self.cache
                if isinstance(i.payload, TypedHeld) and i.payload.keys_digest is not None}

    def entry_frame_limit(self) -> int:
        return self.knowledge.frame_limit()

    def verifier(self, message: msg.Entry, frame: EntryFile | None,
                 now: float) -> Callable[[], Held]:
        return partial(verify_typed, message, fleet_id=self.fleet_id, manifest=self.manifest,
                       ledger=self.ledger.view(), schema=self.knowledge,
                       max_skew=self.limits.max_future_skew_s, now=now, frame=frame)

    def wants(self, offered: msg.Digest, now: float) -> msg.Want:
        """Knowledge entries as NodeState.wants picks them (it skips other kinds), then at
        most one keys entry per origin whose knowledge we hold or asked for and whose keys
        we lack: the one our cached entry names, if we know it."""
        base = super().wants(offered, now)
        refs = self.references()
        asked = {origin for origin, _ in base.items}
        keys: dict[str, tuple[str, int]] = {}
        for item in offered.entries:
            origin = item.origin
            if item.kind != KEYS or origin == self.id or origin in keys:
                continue
            digest = item.digest.hex()
            held = self.keys.get(origin)
            if held is not None and held.entry.meta.digest == digest:
                continue  # have it
            if origin in asked or refs.get(origin) == digest:
                keys[origin] = (origin, item.version)
        return msg.Want(base.items + tuple(keys.values()))

    # -------------------------------------------------------------- state changes
    def accept(self, verified: Held, *, sender: str, now: float) -> Reason | None:
        meta = verified.entry.meta
        if meta.kind == KEYS:
            self.count_bytes("received", verified)
            if meta.origin == self.id:
                self.reject(Reason.OWN_ORIGIN)
                return Reason.OWN_ORIGIN
            if not isinstance(verified, TypedHeld) or \
                    self.references().get(meta.origin) != meta.digest:
                self.reject(Reason.UNREFERENCED)
                return Reason.UNREFERENCED
            self.keys[meta.origin] = verified
            self.accepted += 1
            return None
        reason = super().accept(verified, sender=sender, now=now)
        self._prune()
        return reason

    def expire(self, now: float) -> list[CacheItem]:
        expired = super().expire(now)
        self._prune()
        return expired

    def check_views(self, check: Callable[[Manifest, EntryMeta], Reason | None]) -> None:
        """Check every knowledge entry by ``check`` from now on, and the held ones now (a
        restored cache was admitted before the mode said what it accepts)."""
        self.view_check = check
        for item in list(self.cache):
            reason = self.refuse(item.meta)
            if reason is not None:
                self.cache.remove(item)
                self.reject(reason)
        self._prune()

    def refuse(self, meta: EntryMeta) -> Reason | None:
        if self.view_check is None or meta.kind != KNOWLEDGE:
            return None
        return self.view_check(self.manifest, meta)

    def install_manifest(self, manifest: Manifest, envelope: SignedEnvelope | None,
                         now: float) -> None:
        super().install_manifest(manifest, envelope, now)
        if self.view_check is not None:  # a new manifest may move a binding
            self.check_views(self.view_check)
        self._prune()

    def _take_out(self, origins: set[str] | frozenset[str], reason: Reason) -> list[Withdrawn]:
        gone = super()._take_out(origins, reason)
        self._prune()  # their keys go with them
        return gone

    def _prune(self) -> None:
        """Keys entries go with the last cached knowledge entry that names them."""
        refs = self.references()
        for origin in [o for o, h in self.keys.items() if refs.get(o) != h.entry.meta.digest]:
            del self.keys[origin]

    def set_own_keys(self, held: TypedHeld) -> None:
        """Our keys entry (content-addressed: no ledger record)."""
        self.own_keys = held

    def drop(self, origin: str, reason: Reason) -> None:
        """Remove an origin's knowledge (it cannot be used: see :meth:`batches`)."""
        self.cache = [i for i in self.cache if i.meta.origin != origin]
        self.reject(reason)
        self._prune()

    def views(self) -> list[ViewRows]:
        """The cached views (a view schema's knowledge entries), freshest first, as fresh
        arrays: what the cordial round reads the peers' vectors from."""
        out: list[ViewRows] = []
        for item in self.cache:
            held, meta = item.payload, item.meta
            if not isinstance(held, TypedHeld) or "vectors" not in held.arrays:
                continue
            out.append(ViewRows(meta.origin, meta.version, meta.created_at,
                                held.arrays["ids"].astype(np.int64),
                                held.arrays["vectors"].astype(np.float32), meta.group))
        return out

    def batches(self) -> list[Rows]:
        """The cached knowledge joined with its keys, for the round's knowledge cache.
        Entries whose keys have not arrived yet are skipped (they join next round); one whose
        ids are beyond its keys is dropped (PAYLOAD_MISMATCH: the origin named the wrong
        keys)."""
        out: list[Rows] = []
        for item in list(self.cache):
            held, meta = item.payload, item.meta
            keys = self.keys.get(meta.origin)
            if not isinstance(held, TypedHeld) or keys is None:
                continue
            try:
                k, labels, logits = join_rows(keys.arrays, held.arrays)
            except ProtocolError as exc:
                self.drop(meta.origin, exc.reason)
                continue
            out.append(Rows(meta.origin, meta.version, meta.created_at, k, labels, logits))
        return out


def sign_own_keys(key: Ed25519PrivateKey, fleet_id: bytes, schema: KnowledgeSchema, *,
                  version: int, created_at: float, keys: npt.NDArray[np.float32],
                  labels: npt.NDArray[np.int64]) -> TypedHeld:
    return sign_typed(sign_keys(key, fleet_id, schema=schema, version=version,
                                created_at=created_at, keys=keys, labels=labels))


def sign_own_knowledge(key: Ed25519PrivateKey, fleet_id: bytes, schema: KnowledgeSchema, *,
                       version: int, created_at: float, ids: npt.NDArray[np.int32],
                       logits: npt.NDArray[np.float32], keys_digest: str,
                       group: str | None = None) -> TypedHeld:
    return sign_typed(sign_knowledge(key, fleet_id, schema=schema, version=version,
                                     created_at=created_at, ids=ids, logits=logits,
                                     keys_digest=keys_digest, group=group))


def sign_own_view(key: Ed25519PrivateKey, fleet_id: bytes, schema: KnowledgeSchema, *,
                  version: int, created_at: float, ids: npt.NDArray[np.int32],
                  vectors: npt.NDArray[np.float32], group: str | None = None) -> TypedHeld:
    return sign_typed(sign_view(key, fleet_id, schema=schema, version=version,
                                created_at=created_at, ids=ids, vectors=vectors, group=group))
