"""Staleness: how old a cached model is, and the τ_max cliff (lecture §3.9.3).

Two clocks, chosen per deployment:

* **round mode** — ``s = t − τ_j`` with ``t`` the local round and ``τ_j`` the entry's version
  (its origin's round). Right for the simulator, where all agents share one round counter.
* **time mode** — ``s = now − created_at`` in seconds. Right for real devices, which share no
  round counter but do share (roughly) wall-clock time; the daemon's default.

Keep iff ``s ≤ τ_max``. The clock is passed in: core code never reads the time itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from peerd.core.entry import EntryMeta


class StalenessMode(StrEnum):
    ROUNDS = "rounds"
    TIME = "time"


@dataclass(frozen=True, slots=True)
class Clock:
    """The observer's notion of "now": a round number or UNIX seconds, per ``mode``."""

    mode: StalenessMode
    now: float

    @classmethod
    def rounds(cls, t: int) -> Clock:
        return cls(StalenessMode.ROUNDS, float(t))

    @classmethod
    def time(cls, now: float) -> Clock:
        return cls(StalenessMode.TIME, now)

    def staleness(self, meta: EntryMeta) -> float:
        """Age of an entry: rounds (t − version) or seconds (now − created_at).

        A negative age (an entry from the future by a skewed clock) is reported as is; the
        validator bounds how far in the future an entry may claim to be.
        """
        stamp = float(meta.version) if self.mode is StalenessMode.ROUNDS else meta.created_at
        return self.now - stamp

    def recency(self, meta: EntryMeta) -> float:
        """The stamp that orders entries from freshest to oldest under this clock."""
        return float(meta.version) if self.mode is StalenessMode.ROUNDS else meta.created_at


def is_fresh(staleness: float, tau_max: float) -> bool:
    """The cliff: keep iff ``s ≤ τ_max``. NaN ages are never fresh."""
    if math.isnan(tau_max) or tau_max < 0:
        raise ValueError(f"tau_max must be a non-negative number, got {tau_max}")
    return staleness <= tau_max
