"""Per-origin replay / rollback / equivocation / version-bound tracking (pure, bounded by fleet
size).

For each origin the ledger remembers the highest version accepted, that version's payload
digest and its ``created_at``. An entry is refused when:

* its origin is flagged: EQUIVOCATION (see below);
* its version is lower than or equal to the held one: NOT_NEWER (replay or rollback: dropped
  and counted, not an attack by itself since gossip re-delivers);
* its version equals the held one with another digest: EQUIVOCATION, proven by two valid
  signatures from the origin, and the origin is flagged. Entries from a flagged origin are
  refused until an operator clears the flag (``peerd flags clear ORIGIN``): an origin that
  signs two different models under one version cannot be trusted to mean either;
* its version is further ahead than time allows: VERSION_TOO_HIGH (:func:`version_limit`).
  A version at the integer ceiling would leave its origin nothing newer to publish, ever.

Threads: an :class:`OriginLedger` is mutable and belongs to one thread (the node's event
loop). A worker thread gets a :class:`LedgerView` instead (:meth:`OriginLedger.view`): an
immutable snapshot whose :meth:`LedgerView.check` never changes anything. An equivocation it
finds is raised as :class:`EquivocationError` (naming the signed origin) and flagged by the
owner thread (:meth:`OriginLedger.flag`).

The ``owner`` (the node's own origin) is never flagged and its version is bound only
absolutely: after a state loss the node learns its own highest version back from its peers,
a jump by design (``peerd.node.state``).

Holds no clock and writes no file: ``peerd.store.ledgerfile`` persists it in the state
directory, ``peerd.node.state`` keeps it in memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from peerd.core.reasons import Reason
from peerd.protocol.errors import ProtocolError
from peerd.protocol.limits import (
    MAX_VERSION,
    MAX_VERSIONS_PER_S,
    VERSION_EPOCH_S,
    VERSION_SLACK,
)


@dataclass(frozen=True, slots=True)
class Held:
    version: int
    digest: str
    #: The held entry's signed ``created_at``; None when not known (then only the absolute
    #: bound of :func:`version_limit` applies to the next one).
    created_at: float | None = None


class EquivocationError(ProtocolError):
    """EQUIVOCATION newly proven (two signed payloads under one version; raised after the
    origin's signature was checked): whoever owns the ledger flags ``origin``
    (:meth:`OriginLedger.flag`). An entry of an origin already flagged is refused with a plain
    :class:`ProtocolError` of the same reason."""

    def __init__(self, origin: str, message: str) -> None:
        super().__init__(Reason.EQUIVOCATION, message)
        self.origin = origin


def _elapsed(later: float, earlier: float) -> float:
    since = later - earlier
    return since if math.isfinite(since) and since > 0 else 0.0


def version_limit(held: Held | None, created_at: float, *, owner: bool = False) -> int:
    """The highest version an origin's entry created at ``created_at`` may carry.

    No origin can publish faster than :data:`MAX_VERSIONS_PER_S` on average (a round
    trains, signs and fsyncs; a daemon runs one per round interval): so a version is at most
    ``VERSION_SLACK + MAX_VERSIONS_PER_S × (created_at − VERSION_EPOCH_S)`` and, after a held
    entry, at most ``held.version + VERSION_SLACK + MAX_VERSIONS_PER_S × (created_at −
    held.created_at)``; never above :data:`MAX_VERSION`. ``owner``: the node's own origin,
    bound only absolutely (it may learn its own versions back after a state loss).
    """
    limit = VERSION_SLACK + MAX_VERSIONS_PER_S * _elapsed(created_at, VERSION_EPOCH_S)
    if not owner and held is not None and held.created_at is not None:
        since_held = _elapsed(created_at, held.created_at)
        limit = min(limit, held.version + VERSION_SLACK + MAX_VERSIONS_PER_S * since_held)
    return min(MAX_VERSION, math.floor(limit))


def check_entry(
    held: Mapping[str, Held], flagged: frozenset[str] | set[str], owner: str | None,
    origin: str, version: int, digest: str, created_at: float,
) -> None:
    """Raise NOT_NEWER, EQUIVOCATION (:class:`EquivocationError`) or VERSION_TOO_HIGH;
    return if the entry is newer than what is held and within bounds. Changes nothing."""
    own = origin == owner
    if origin in flagged and not own:
        # Not an EquivocationError: nothing new is proven, and a snapshot taken before an
        # operator cleared the flag must not set it again.
        raise ProtocolError(Reason.EQUIVOCATION, f"{origin} is flagged for equivocation")
    prev = held.get(origin)
    if prev is not None:
        if version == prev.version and digest != prev.digest and not own:
            raise EquivocationError(
                origin, f"{origin} signed two payloads for version {version}")
        if version <= prev.version:
            raise ProtocolError(
                Reason.NOT_NEWER, f"{origin} version {version} <= held {prev.version}")
    limit = version_limit(prev, created_at, owner=own)
    if version > limit:
        since = "" if prev is None else f" after version {prev.version}"
        raise ProtocolError(
            Reason.VERSION_TOO_HIGH,
            f"{origin} version {version} created at {created_at}{since}: over {limit}, "
            "more than time allows")


@dataclass(frozen=True, slots=True)
class LedgerView:
    """An immutable snapshot of an :class:`OriginLedger`, for a worker thread."""

    held: Mapping[str, Held] = field(default_factory=lambda: MappingProxyType({}))
    flagged: frozenset[str] = frozenset()
    owner: str | None = None
    #: The ledger's :attr:`OriginLedger.revision` when the snapshot was taken.
    revision: int = 0

    def check(self, origin: str, version: int, digest: str, created_at: float) -> None:
        """:func:`check_entry` against the snapshot; never flags (see EquivocationError)."""
        check_entry(self.held, self.flagged, self.owner, origin, version, digest, created_at)


@dataclass
class OriginLedger:
    """The live ledger. Touch it from its owner thread only; hand workers :meth:`view`."""

    held: dict[str, Held] = field(default_factory=dict)
    flagged: set[str] = field(default_factory=set)
    #: The node's own origin: never flagged, bound only absolutely.
    owner: str | None = None
    #: Bumped by every change through the methods below: what to persist, and when.
    revision: int = 0

    def view(self) -> LedgerView:
        """An immutable copy for another thread (cheap: at most one row per member)."""
        return LedgerView(MappingProxyType(dict(self.held)), frozenset(self.flagged),
                          self.owner, self.revision)

    def check(self, origin: str, version: int, digest: str, created_at: float) -> None:
        """:func:`check_entry`, flagging the origin on an equivocation."""
        try:
            check_entry(self.held, self.flagged, self.owner, origin, version, digest, created_at)
        except EquivocationError as exc:
            self.flag(exc.origin)
            raise

    def record(self, origin: str, version: int, digest: str,
               created_at: float | None = None) -> None:
        prev = self.held.get(origin)
        if prev is None or version > prev.version:
            self.held[origin] = Held(version, digest, created_at)
            self.revision += 1

    def flag(self, origin: str) -> None:
        """Refuse ``origin`` from now on (proven equivocation); the owner is never flagged."""
        if origin != self.owner and origin not in self.flagged:
            self.flagged.add(origin)
            self.revision += 1

    def forget(self, origin: str) -> None:
        """Drop an origin (e.g. revoked and removed); clears its flag too."""
        if self.held.pop(origin, None) is not None or origin in self.flagged:
            self.flagged.discard(origin)
            self.revision += 1

    def clear_flag(self, origin: str) -> bool:
        """An operator's decision: accept ``origin`` again. True if it was flagged.

        The held version stays: what it published before is still not newer."""
        if origin not in self.flagged:
            return False
        self.flagged.discard(origin)
        self.revision += 1
        return True

    def retain(self, origins: Iterable[str]) -> None:
        """Forget every origin not in ``origins`` (the members of a new manifest): the ledger
        stays bounded by the fleet's size."""
        keep = {*origins, self.owner}
        for origin in [o for o in (self.held.keys() | self.flagged) if o not in keep]:
            self.forget(origin)

    def merge(self, other: LedgerView) -> None:
        """Take in a persisted ledger: per origin the higher version, flags added."""
        for origin, row in other.held.items():
            prev = self.held.get(origin)
            if prev is None or row.version > prev.version:
                self.held[origin] = row
                self.revision += 1
        for origin in other.flagged:
            self.flag(origin)
