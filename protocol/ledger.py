"""Per-origin replay / rollback / equivocation tracking (pure, bounded by fleet size).

For each origin the ledger remembers the highest version accepted and that version's
payload digest. A lower or equal version is NOT_NEWER (replay or rollback: dropped and
counted, not an attack by itself since gossip re-delivers); the same version with another
digest is EQUIVOCATION, proven by two valid signatures from the origin, and flags it.
Entries from a flagged origin are refused until an operator clears the flag: an origin
that signs two different models under one version cannot be trusted to mean either.

Holds no clock and writes no file: the node keeps it in memory (``peerd.node.state``) and
rebuilds it at start from the entries ``peerd.store.persist`` verifies again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from peerd.core.reasons import Reason
from peerd.protocol.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class Held:
    version: int
    digest: str


@dataclass
class OriginLedger:
    held: dict[str, Held] = field(default_factory=dict)
    flagged: set[str] = field(default_factory=set)

    def check(self, origin: str, version: int, digest: str) -> None:
        """Raise NOT_NEWER or EQUIVOCATION (flagging the origin); return if newer."""
        if origin in self.flagged:
            raise ProtocolError(Reason.EQUIVOCATION, f"{origin} is flagged for equivocation")
        prev = self.held.get(origin)
        if prev is None:
            return
        if version == prev.version and digest != prev.digest:
            self.flagged.add(origin)
            raise ProtocolError(
                Reason.EQUIVOCATION, f"{origin} signed two payloads for version {version}"
            )
        if version <= prev.version:
            raise ProtocolError(
                Reason.NOT_NEWER, f"{origin} version {version} <= held {prev.version}"
            )

    def record(self, origin: str, version: int, digest: str) -> None:
        prev = self.held.get(origin)
        if prev is None or version > prev.version:
            self.held[origin] = Held(version, digest)

    def forget(self, origin: str) -> None:
        """Drop an origin (e.g. revoked and removed); clears its flag too."""
        self.held.pop(origin, None)
        self.flagged.discard(origin)

    def clear_flag(self, origin: str) -> None:
        self.flagged.discard(origin)
