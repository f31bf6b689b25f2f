"""Cache merge: the lecture's five-step update procedure (§3.9.4), made order-independent.

1. Collect received entries with their sender and timestamps (``CacheItem`` provenance).
2. Drop entries — held *and* received — whose staleness exceeds τ_max.
3./4. Per origin keep only the latest: the highest version wins. The same origin and version
   with a *different* payload is equivocation: reported, never silently merged.
5. Sort survivors by recency and keep the first ``C`` (and, with a ``sample_budget``, only as
   many of those as fit it together: knowledge entries are counted in samples, their
   ``num_examples``, since one may carry 10 samples and the next 10,000).

With ``capacity_per_group = q`` (the Cached-DFL paper's group-based cache) step 5 stays the
lecture's "sort by recency, keep the first C", with q as a cap on the group label each origin
signs into its entries (``EntryMeta.group``): walking the survivors freshest first, an entry
is skipped once its group already holds q places; entries that name no group are never
skipped. Equivalently: the C most recent of {every group's q most recent} ∪ {every entry
without a group}. The quota reserves nothing — a group whose entries are all older than C
others gets no place, exactly as in the plain step 5, and an older grouped entry never
evicts a fresher ungrouped one — it only stops a crowd of near-identical neighbours from
filling more than q of the C places, so the places it frees go to the next most recent
entries, grouped or not. With few groups and no ungrouped entries, places stay empty
rather than go to a group over its cap. ``q = None`` is the plain step 5, and so is any
``q`` when no entry names a group (or q >= C).

The node's own model is not a cache entry: it is always part of the blend and does not count
against ``C`` (so ``C`` is exactly the number of *peer* models a node keeps). Entries of our own
origin relayed back to us are dropped (``own_origin``) but their highest version is reported, so
a node that lost its state can skip past versions it already published and never reuse one.

Determinism: the result depends only on the *set* of received items, not their order.
Equally fresh entries competing for the last places are ranked by a hash of the observer's
and the origin's ids, so different nodes keep different peers rather than all the same ones. Among
items with the same origin and version, the held one wins, then the smallest digest (for
equivocation), then the smallest group label (no group first), then the earliest arrival and
sender id (for identical relayed copies).
The cost is O(n) grouping plus O(n log C) selection, so 10,000 received entries are cheap.

It decides on metadata only: it never reads a payload, checks a signature
(``peerd.protocol.admission``) or validates values (:mod:`peerd.core.validate`).
"""

from __future__ import annotations

import hashlib
import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from peerd.core.entry import CacheItem
from peerd.core.reasons import Reason
from peerd.core.staleness import Clock, is_fresh


@dataclass(frozen=True, slots=True)
class Equivocation:
    """One origin signed two different payloads under one version."""

    origin: str
    version: int
    digests: tuple[str, ...]  # sorted, all distinct payload digests seen


@dataclass(frozen=True, slots=True)
class MergeResult:
    cache: tuple[CacheItem, ...]  # freshest first, at most `capacity` items
    accepted: tuple[CacheItem, ...]  # received items that are now in the cache
    expired: tuple[CacheItem, ...]  # previously held items that aged past τ_max
    dropped: dict[Reason, int]  # received items not kept, by reason (+ expired held: STALE)
    equivocations: tuple[Equivocation, ...]
    own_max_version: int | None  # highest version of our own origin seen relayed back


def _preference(
    item: CacheItem, held_ids: set[int]
) -> tuple[bool, str, bool, str, float, str]:
    """Sort key among same-origin, same-version items: lowest is kept."""
    group = item.meta.group
    return (id(item) not in held_ids, item.meta.digest, group is not None, group or "",
            item.received_at, item.received_from or "")


def _by_group(
    winners: Sequence[CacheItem], order: Callable[[CacheItem], tuple[float, bytes, str]],
    capacity: int, quota: int,
) -> list[CacheItem]:
    """Step 5 with a per-group cap (module docstring): the ``capacity`` most recent of every
    group's ``quota`` most recent and every entry without a group, freshest first."""
    groups: dict[str, list[CacheItem]] = {}
    eligible: list[CacheItem] = []
    for item in winners:
        if item.meta.group is None:
            eligible.append(item)
        else:
            groups.setdefault(item.meta.group, []).append(item)
    # A group's entries beyond its q freshest can never be kept: a fresher one of the same
    # group would take the place first, so dropping them up front is the cap.
    for members in groups.values():
        eligible += heapq.nsmallest(min(quota, capacity), members, key=order)
    return heapq.nsmallest(capacity, eligible, key=order)


def merge(
    held: Sequence[CacheItem],
    received: Iterable[CacheItem],
    *,
    clock: Clock,
    tau_max: float,
    capacity: int,
    own_origin: str | None = None,
    sample_budget: int | None = None,
    capacity_per_group: int | None = None,
) -> MergeResult:
    """Merge ``received`` into ``held``; returns the new cache and an account of every drop.
    ``capacity_per_group``: the most places one group may hold (module docstring)."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    if capacity_per_group is not None and capacity_per_group < 0:
        raise ValueError(f"capacity_per_group must be >= 0, got {capacity_per_group}")
    dropped: Counter[Reason] = Counter()
    expired: list[CacheItem] = []
    own_max: int | None = None
    held_ids = {id(item) for item in held}

    # Step 2 (age) and own-origin filtering, then step 3 grouping by origin.
    groups: dict[str, list[CacheItem]] = {}
    for is_held, items in ((True, held), (False, received)):
        for item in items:
            meta = item.meta
            if own_origin is not None and meta.origin == own_origin:
                if not is_held:
                    dropped[Reason.OWN_ORIGIN] += 1
                own_max = meta.version if own_max is None else max(own_max, meta.version)
                continue
            if not is_fresh(clock.staleness(meta), tau_max):
                dropped[Reason.STALE] += 1
                if is_held:
                    expired.append(item)
                continue
            groups.setdefault(meta.origin, []).append(item)

    # Step 4: per origin the highest version; ties broken by `_preference`.
    winners: list[CacheItem] = []
    conflicts: list[Equivocation] = []
    for origin, items in groups.items():
        top = max(item.meta.version for item in items)
        contenders = [item for item in items if item.meta.version == top]
        best = min(contenders, key=lambda item: _preference(item, held_ids))
        winners.append(best)
        for item in items:
            if item is best or id(item) in held_ids:
                continue  # a superseded held entry is replaced, not "dropped"
            if item.meta.version == top and item.meta.digest != best.meta.digest:
                dropped[Reason.EQUIVOCATION] += 1
            else:
                dropped[Reason.NOT_NEWER] += 1
        digests = {item.meta.digest for item in contenders}
        if len(digests) > 1:
            conflicts.append(Equivocation(origin, top, tuple(sorted(digests))))

    # Step 5: freshest first, keep C. nsmallest is O(n log C). Ties (equally fresh entries,
    # common in round mode) are broken by a hash of (observer, origin): deterministic for
    # each node, but different across nodes — ordering by origin id alone would make every
    # node of the fleet keep the same lowest-id peers and ignore the rest.
    def order(item: CacheItem) -> tuple[float, bytes, str]:
        salt = hashlib.blake2b(f"{own_origin}\0{item.meta.origin}".encode(), digest_size=8)
        return (-clock.recency(item.meta), salt.digest(), item.meta.origin)

    if capacity_per_group is None:
        kept = heapq.nsmallest(capacity, winners, key=order)
    else:
        kept = _by_group(winners, order, capacity, capacity_per_group)
    if sample_budget is not None:
        # Freshest first until the budget is spent; a fresher entry never loses its place to
        # a smaller, older one (that would reward splitting knowledge into small entries).
        total, fits = 0, []
        for item in kept:
            total += item.meta.num_examples
            if total > sample_budget:
                break
            fits.append(item)
        kept = fits
    kept_ids = {id(item) for item in kept}
    for item in winners:
        if id(item) not in kept_ids:
            dropped[Reason.EVICTED] += 1
    accepted = tuple(item for item in kept if id(item) not in held_ids)
    conflicts.sort(key=lambda e: (e.origin, e.version))
    return MergeResult(
        cache=tuple(kept),
        accepted=accepted,
        expired=tuple(expired),
        dropped=dict(dropped),
        equivocations=tuple(conflicts),
        own_max_version=own_max,
    )
