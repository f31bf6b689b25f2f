"""One node's gossip state: its own signed entry, its cache, and what to ask peers for.

This is the seam between the wire (``peerd.protocol``: frames, signatures, membership) and
the algorithm (``peerd.core``: validation, merge, α, blend). It reads no clock (the daemon
passes ``now`` in), opens no file or socket and writes nothing. Its one contact with the
operating system: an entry may be backed by a state file that the caller mapped
(an :class:`~peerd.node.entryfile.EntryFile`, in practice the store's ``MappedFrame``); this
module reads and hashes the mapped bytes and hands their pages back to the kernel
(``madvise``, through ``EntryFile.release`` and ``EntryFile.paged``) once they are read. The
daemon runs the expensive parts (:func:`verify`, :func:`sign_own`) in worker threads while
state changes stay on the event-loop thread.

Receiving an entry is two steps so that 44 MB of hashing never blocks the event loop:
:func:`verify` (thread: signature, membership, payload hash, schema, finite values, norm,
checked against an immutable snapshot of the ledger) then :meth:`NodeState.accept` (loop
thread: the live replay/equivocation/version ledger, τ_max/C merge). The ledger is only ever
read or changed on the loop thread; a worker gets a :class:`LedgerView`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

import numpy.typing as npt
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.core.cache import merge
from peerd.core.entry import CacheItem, Entry, EntryMeta, Schema
from peerd.core.reasons import BENIGN, Reason
from peerd.core.staleness import Clock, StalenessMode, is_fresh
from peerd.core.validate import ValidationLimits, validate_entry
from peerd.node.decoded import DecodedParams
from peerd.node.entryfile import EntryFile
from peerd.node.wirearrays import from_wire_arrays, to_wire_arrays, wire_schema
from peerd.protocol import messages as msg
from peerd.protocol.admission import admit_entry, entry_frame_limit, sha256_hex
from peerd.protocol.encoding import RAW, Encoding
from peerd.protocol.entry import EntryBody, SignedEntry, sign_entry
from peerd.protocol.envelope import SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import node_id_of
from peerd.protocol.ledger import LedgerView, OriginLedger, version_limit
from peerd.protocol.manifest import Manifest
from peerd.protocol.tensors import decode_tensors, index_encoding


def meta_of(body: EntryBody) -> EntryMeta:
    return EntryMeta(
        origin=body.origin,
        version=body.version,
        created_at=body.created_at,
        schema_id=body.schema_id,
        num_examples=body.num_examples,
        digest=body.digest,
        kind=body.kind,
        group=body.group,
    )


def digest_item(meta: EntryMeta) -> msg.DigestItem:
    """How a held entry is announced (a Digest, or the list of what follows)."""
    return msg.DigestItem(meta.origin, meta.version, meta.created_at, bytes.fromhex(meta.digest),
                          meta.kind)


@dataclass(frozen=True, slots=True)
class Held:
    """A cache entry's payload: torch views for blending, the untouched message for relaying.

    ``frame`` is the mapped state file the payload lives in (see peerd.store.spool), and
    ``entry.params`` are then its paged view (:meth:`EntryFile.paged`); None for an entry
    held in memory.
    """

    entry: Entry
    message: msg.Entry
    frame: EntryFile | None = None
    #: How its origin encoded its float32 tensors (``[fleet] entry_encoding``: what crossed
    #: the wire; the blend reads float32 either way), for ``peerd status``.
    encoding: Encoding = RAW

    def release(self) -> None:
        """Hand the entry's resident pages back (a no-op for an entry held in memory)."""
        if self.frame is not None:
            self.frame.release()


def held_entry(
    body: EntryBody, message: msg.Entry, arrays: Mapping[str, npt.NDArray[Any]],
    frame: EntryFile | None,
) -> Entry:
    """The core's view of a decoded entry: torch views of its payload, paged when mapped
    (encoded tensors then decoded when read, see :class:`DecodedParams`)."""
    if frame is None:
        return Entry(meta_of(body), from_wire_arrays(body.tensors, arrays))
    base = len(frame.body) - len(message.payload)
    raw = [i for i in body.tensors if i.codec is None]
    ranges = {i.name: (base + i.offset, base + i.offset + i.nbytes) for i in raw}
    params = frame.paged(from_wire_arrays(raw, arrays), ranges)
    if len(raw) < len(body.tensors):
        params = DecodedParams(body.tensors, frame, base, params)
    return Entry(meta_of(body), params)


def verify(
    message: msg.Entry,
    *,
    fleet_id: bytes,
    manifest: Manifest,
    ledger: LedgerView,
    schema: Schema,
    limits: ValidationLimits,
    now: float,
    frame: EntryFile | None = None,
) -> Held:
    """Protocol admission plus core validation; raises :class:`ProtocolError` with a reason.
    The result is the entry as the cache will hold it (:meth:`NodeState.accept`).

    Pure: ``ledger`` is an immutable snapshot (``node.ledger.view()``, taken on the loop
    thread) consulted to skip hashing replays early; nothing is recorded or flagged here. An
    equivocation is raised as ``EquivocationError``: the caller flags its origin on the
    loop thread (``node.ledger.flag``). Safe in a worker thread.
    ``frame``: the payload is a tail of this mapped file's body; it is then read piece by
    piece and tensor by tensor, and its pages are handed back as they are read.
    """
    try:
        v = admit_entry(
            message, fleet_id=fleet_id, manifest=manifest, ledger=ledger,
            schema=wire_schema(schema), now=now, max_skew=limits.max_future_skew_s,
            record=False, sha256=sha256_hex if frame is None else frame.sha256_tail,
        )
        entry = held_entry(v.body, message, v.tensors, frame)
        # The payload hash was checked by admission: skip the core's second digest pass.
        rejection = validate_entry(entry, schema, limits, now=now, check_digest=False)
    finally:
        if frame is not None:
            frame.release()
    if rejection is not None:
        raise ProtocolError(rejection.reason, rejection.detail)
    return Held(entry, message, frame, index_encoding(v.body.tensors))


def sign_params(
    key: Ed25519PrivateKey,
    fleet_id: bytes,
    *,
    params: Mapping[str, torch.Tensor],
    version: int,
    created_at: float,
    num_examples: int,
    group: str | None = None,
    encoding: Encoding = RAW,
) -> SignedEntry:
    """Sign ``params`` as this node's entry (thread-safe, CPU-heavy), in cache group
    ``group`` if one. The payload parts are views of ``params``: nothing is copied until the
    caller writes or joins them, except float32 tensors in a compact ``encoding`` (``[fleet]
    entry_encoding``), whose encoded bytes are new."""
    arrays, bf16 = to_wire_arrays({k: v.detach() for k, v in params.items()})
    return sign_entry(
        key, fleet_id, version=version, created_at=created_at,
        schema_id=Schema.of(params).id, num_examples=num_examples, tensors=arrays,
        bfloat16=bf16, group=group, encoding=encoding,
    )


def held_signed(signed: SignedEntry, message: msg.Entry, frame: EntryFile | None) -> Held:
    """Our own signed entry as held, its tensors views of ``message``'s payload (joined in
    memory, or mapped from ``frame``)."""
    views = decode_tensors(signed.body.tensors, message.payload)
    return Held(held_entry(signed.body, message, views, frame), message, frame,
                index_encoding(signed.body.tensors))


def sign_own(
    key: Ed25519PrivateKey,
    fleet_id: bytes,
    *,
    params: Mapping[str, torch.Tensor],
    version: int,
    created_at: float,
    num_examples: int,
    group: str | None = None,
    encoding: Encoding = RAW,
) -> tuple[Entry, msg.Entry]:
    """Sign ``params`` as this node's entry, in memory (the daemon signs into a file:
    ``peerd.store.persist.publish_own``).

    The payload is built once; the returned entry's tensors are read-only views into it, so
    the own entry costs one model's worth of memory, like a received one. ``params`` may be
    dropped (or reused) by the caller afterwards.
    """
    signed = sign_params(key, fleet_id, params=params, version=version,
                         created_at=created_at, num_examples=num_examples, group=group,
                         encoding=encoding)
    held = held_signed(signed, signed.to_message(), None)  # the one copy: the payload
    return held.entry, held.message


@dataclass(frozen=True, slots=True)
class Withdrawn:
    """A cached entry taken out because its origin may no longer be used: ``reason`` is
    ``equivocation`` (flagged), or ``revoked`` / ``not_member`` / ``expired`` (the manifest).
    What the participation audit records (``peerd.daemon.host.expire_stale``)."""

    origin: str
    version: int
    reason: Reason


@dataclass
class NodeState:
    """Mutable gossip state of one node. Touch it from one thread only (the event loop)."""

    key: Ed25519PrivateKey
    fleet_id: bytes
    manifest: Manifest
    schema: Schema
    limits: ValidationLimits
    tau_max: float
    capacity: int
    mode: StalenessMode = StalenessMode.TIME
    round: int = 0
    own: Held | None = None
    cache: list[CacheItem] = field(default_factory=list)
    ledger: OriginLedger = field(default_factory=OriginLedger)
    rejected: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    own_max_version_seen: int = -1
    #: Entries admitted into the cache since start (a counter: evictions don't lower it).
    accepted: int = 0
    #: The signed form of ``manifest``, handed to peers that hold an older one.
    manifest_envelope: SignedEnvelope | None = None
    #: Entry bytes (signed body and payload) by "sent/KIND" and "received/KIND" (verified
    #: entries), since start: what ``peerd status`` and the metrics show per kind.
    entry_bytes: Counter[str] = field(default_factory=Counter)
    #: Capacity in samples besides C entries (knowledge mode, peerd.node.knowstate); None:
    #: entries are counted, not their samples.
    sample_budget: int | None = None
    #: This node's cache group (``[learning] group``), signed into every entry it publishes;
    #: None: its entries name no group.
    group: str | None = None
    #: The most cache places one group may hold (``[learning] capacity_per_group``,
    #: peerd.core.cache); None: plain recency.
    capacity_per_group: int | None = None
    #: Entries withdrawn since the daemon last took them (:meth:`withdraw`): a flag or a
    #: manifest acts on what is already held, not only on what comes next (issue 24).
    withdrawn: list[Withdrawn] = field(default_factory=list)
    #: How this node encodes the float32 tensors of the entries it publishes (``[fleet]
    #: entry_encoding``, peerd.protocol.encoding); it accepts every encoding.
    encoding: Encoding = RAW

    #: The kind of entry this node blends and publishes (typed nodes override it).
    entry_kind: ClassVar[str] = "weights"

    def __post_init__(self) -> None:
        self.id = node_id_of(self.key)
        self.ledger.owner = self.id  # never flagged; its versions bound only absolutely

    def own_high_water(self) -> int:
        """The highest version of our own origin we know of: published or seen at peers."""
        own = self.own.entry.meta.version if self.own is not None else -1
        return max(own, self.own_max_version_seen)

    # -------------------------------------------------------------- clocks and digests
    def clock(self, now: float) -> Clock:
        return Clock.rounds(self.round) if self.mode is StalenessMode.ROUNDS else Clock.time(now)

    def holdings(self) -> list[Held]:
        """Own entry first, then the cache (freshest first)."""
        held = [self.own] if self.own is not None else []
        return held + [item.payload for item in self.cache if isinstance(item.payload, Held)]

    def digest(self) -> msg.Digest:
        return msg.Digest(tuple(digest_item(h.entry.meta) for h in self.holdings()))

    def entry_frame_limit(self) -> int:
        """The largest entry frame this node reads (checked before it is buffered)."""
        return entry_frame_limit(wire_schema(self.schema))

    def verifier(self, message: msg.Entry, frame: EntryFile | None,
                 now: float) -> Callable[[], Held]:
        """:func:`verify` with snapshots taken now, on the loop thread, for a worker thread
        to run: the live ledger and manifest may change meanwhile."""
        return partial(verify, message, fleet_id=self.fleet_id, manifest=self.manifest,
                       ledger=self.ledger.view(), schema=self.schema, limits=self.limits,
                       now=now, frame=frame)

    def wants(self, offered: msg.Digest, now: float) -> msg.Want:
        """What to ask a peer for: the entries that would survive a merge into our cache.

        The merge runs on metadata only, so we never download an entry that is stale, not
        newer than what we hold, further ahead than time allows, from an unknown origin, or
        would be evicted at once by C.

        Our own origin is asked for only when the peer holds a version of ours newer than
        any we know of: we lost our state. The entry is verified against our own key and
        only raises :attr:`own_max_version_seen` (:meth:`accept`), so that our next publish
        is newer than anything peers hold of us; the Digest's number alone is never trusted
        (it is unsigned).

        With a per-group quota, C does not cut here: a Digest item names no group (the group
        is signed in the body, unknown until the entry arrives), so an older entry that would
        take a place a capped group leaves must not be ruled out by recency alone. What a
        peer offers is bounded by its own C + 1; :meth:`accept` applies the quota.
        """
        candidates = []
        own: msg.DigestItem | None = None
        for item in offered.entries:
            if not math.isfinite(item.created_at) or item.kind != self.entry_kind:
                continue
            if item.origin == self.id:
                best = self.own_high_water() if own is None else own.version
                if best < item.version <= version_limit(None, item.created_at, owner=True):
                    own = item
                continue
            if item.origin in self.ledger.flagged:
                continue
            held = self.ledger.held.get(item.origin)
            if held is not None and item.version <= held.version:
                continue
            if item.version > version_limit(held, item.created_at):
                continue  # would be refused as version_too_high: don't fetch it
            try:
                self.manifest.check_member(item.origin, now)
            except ProtocolError:
                continue  # don't fetch 44 MB just to reject it as a non-member
            meta = EntryMeta(item.origin, item.version, item.created_at, self.schema.id, 1,
                             item.digest.hex(), item.kind)
            candidates.append(CacheItem(meta, None, now))
        grouped = self.capacity_per_group is not None
        result = merge(self.cache, candidates, clock=self.clock(now), tau_max=self.tau_max,
                       capacity=len(self.cache) + len(candidates) if grouped else self.capacity,
                       own_origin=self.id,
                       sample_budget=None if grouped else self.sample_budget)
        # Our own first: it decides whether our next publish reaches anyone at all.
        mine = () if own is None else ((own.origin, own.version),)
        return msg.Want(mine + tuple((i.meta.origin, i.meta.version) for i in result.accepted))

    def to_send(self, want: msg.Want) -> list[Held]:
        """The wanted entries we still hold, in the order asked (the asker sorts freshest
        first). Relayed entries go out exactly as received: the origin's signature intact."""
        by_key = {(h.entry.meta.origin, h.entry.meta.version): h for h in self.holdings()}
        out = [by_key[k] for k in want.items if k in by_key]
        for held in out:
            self.count_bytes("sent", held)
        return out

    def count_bytes(self, direction: str, held: Held) -> None:
        """Add an entry's signed body and payload to :attr:`entry_bytes` (the frame less its
        envelope's fixed ~130 bytes)."""
        size = len(held.message.envelope.body) + len(held.message.payload)
        self.entry_bytes[f"{direction}/{held.entry.meta.kind}"] += size

    # -------------------------------------------------------------- state changes
    def set_own(self, entry: Entry, message: msg.Entry, frame: EntryFile | None = None) -> None:
        self.own = Held(entry, message, frame)
        self.ledger.record(self.id, entry.meta.version, entry.meta.digest, entry.meta.created_at)

    def reject(self, reason: Reason | str) -> None:
        (self.dropped if reason in BENIGN else self.rejected)[str(reason)] += 1

    def restore_ledger(self, stored: LedgerView) -> None:
        """Take in the ledger persisted by the last run (``peerd.store.ledgerfile``): per
        origin the higher version, flags kept. Called after the own entry and the cache were
        restored (they are verified against the ledger, and ours may be older than the
        highest version of ours seen, which becomes the floor of our next one)."""
        self.ledger.merge(stored)
        mine = self.ledger.held.get(self.id)
        if mine is not None:
            self.own_max_version_seen = max(self.own_max_version_seen, mine.version)
        if self.manifest_envelope is not None:  # a signed manifest: drop who left the fleet
            self.ledger.retain(m.node_id for m in self.manifest.members)
        # The cache was restored before the flags (see above): an entry its origin had held
        # before it was caught must not come back into the blend with the restart.
        self._take_out(self.ledger.flagged, Reason.EQUIVOCATION)

    def accept(self, verified: Held, *, sender: str, now: float) -> Reason | None:
        """Admit a verified entry into the cache; returns why it was not kept, if it wasn't."""
        meta = verified.entry.meta
        if meta.kind == self.entry_kind:  # typed nodes count their other kinds themselves
            self.count_bytes("received", verified)
        try:
            self.ledger.check(meta.origin, meta.version, meta.digest, meta.created_at)
        except ProtocolError as exc:  # an equivocation is flagged by the check itself
            self.reject(exc.reason)
            if exc.reason is Reason.EQUIVOCATION:
                # What it sent before the flag goes too (the check flagged it, see ledger).
                self._take_out({meta.origin} & self.ledger.flagged, Reason.EQUIVOCATION)
            return exc.reason
        self.ledger.record(meta.origin, meta.version, meta.digest, meta.created_at)
        if meta.origin == self.id:
            # Ours, fetched back because we had lost it (see wants): the own model is no
            # cache entry; its version is where our next publish must start above.
            self.own_max_version_seen = max(self.own_max_version_seen, meta.version)
            self.reject(Reason.OWN_ORIGIN)
            return Reason.OWN_ORIGIN
        # After the ledger took its version: a refused entry is not wanted again.
        refused = self.refuse(meta)
        if refused is not None:
            self.reject(refused)
            return refused
        item = CacheItem(meta, sender, now, payload=verified)
        result = merge(self.cache, [item], clock=self.clock(now), tau_max=self.tau_max,
                       capacity=self.capacity, own_origin=self.id,
                       sample_budget=self.sample_budget,
                       capacity_per_group=self.capacity_per_group)
        self.cache = list(result.cache)
        for reason, n in result.dropped.items():
            for _ in range(n):
                self.reject(reason)
        if result.own_max_version is not None:
            self.own_max_version_seen = max(self.own_max_version_seen, result.own_max_version)
        for equivocation in result.equivocations:
            self.flag(equivocation.origin)
        if item in result.accepted:
            self.accepted += 1
            return None
        fresh = is_fresh(self.clock(now).staleness(meta), self.tau_max)
        return Reason.EVICTED if fresh else Reason.STALE

    def refuse(self, meta: EntryMeta) -> Reason | None:
        """Why a mode refuses a verified entry of a member before it is cached (None: no
        objection); typed nodes override it (cordial views, peerd.node.knowstate)."""
        return None

    def expire(self, now: float) -> list[CacheItem]:
        """Drop entries that aged past τ_max (called every round and before blending)."""
        result = merge(self.cache, [], clock=self.clock(now), tau_max=self.tau_max,
                       capacity=self.capacity, own_origin=self.id,
                       sample_budget=self.sample_budget,
                       capacity_per_group=self.capacity_per_group)
        self.cache = list(result.cache)
        for _ in result.expired:
            self.reject(Reason.STALE)
        return list(result.expired)

    def install_manifest(
        self, manifest: Manifest, envelope: SignedEnvelope | None, now: float
    ) -> None:
        """Adopt a newer manifest; evict entries whose origin is no longer an active member."""
        self.manifest = manifest
        self.manifest_envelope = envelope
        self.ledger.retain(m.node_id for m in manifest.members)  # bounded by the fleet
        for gone in self._take_out_non_members(now):
            self.reject(gone.reason)
            self.ledger.forget(gone.origin)

    def flag(self, origin: str) -> None:
        """Flag ``origin`` for equivocation (``ledger.flag``) and take its cached entry out
        at once: the flag proves it signs two models under one version, so the one held
        from before cannot be trusted to mean either."""
        self.ledger.flag(origin)
        self._take_out({origin} & self.ledger.flagged, Reason.EQUIVOCATION)

    def withdraw(self, now: float) -> list[Withdrawn]:
        """The entries withdrawn since the last call, after taking out every cached entry
        whose origin is flagged (whoever set the flag) or no longer an active member at
        ``now`` (a membership ends by time too, without a new manifest). Called before each
        blend (``peerd.daemon.host.expire_stale``)."""
        self._take_out(self.ledger.flagged, Reason.EQUIVOCATION)
        self._take_out_non_members(now)
        out, self.withdrawn = self.withdrawn, []
        return out

    def _take_out_non_members(self, now: float) -> list[Withdrawn]:
        why: dict[str, Reason] = {}
        for item in self.cache:
            try:
                self.manifest.check_member(item.meta.origin, now)
            except ProtocolError as exc:  # revoked, not_member, expired
                why[item.meta.origin] = exc.reason
        return [w for origin, reason in why.items() for w in self._take_out({origin}, reason)]

    def _take_out(self, origins: set[str] | frozenset[str], reason: Reason) -> list[Withdrawn]:
        """Remove the cached entries of ``origins``, noting them in :attr:`withdrawn`."""
        gone = [Withdrawn(i.meta.origin, i.meta.version, reason)
                for i in self.cache if i.meta.origin in origins]
        if gone:
            self.cache = [i for i in self.cache if i.meta.origin not in origins]
            self.withdrawn += gone
        return gone

    def release(self) -> None:
        """Hand back the resident pages of every mapped entry (after a round or a session)."""
        for held in self.holdings():
            held.release()

    def blend_inputs(self) -> list[Entry]:
        return [item.payload.entry for item in self.cache if isinstance(item.payload, Held)]
