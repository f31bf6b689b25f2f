"""The daemon's participation audit: what happened between two rounds, written as one record
per round.

Between rounds it collects the entries the sessions refused (by peer and reason, bounded) and
the entries that expired; each round it joins them with the round's plan (α), the weights the
blend rule actually used, each member's staleness and drift, and appends one
:class:`peerd.control.audit.RoundRecord` to the state directory's round log
(:mod:`peerd.store.roundlog`). It answers the control API's ``audit`` from the log's memory
mirror.

Wiring only: the record's shape is :mod:`peerd.control.audit`'s, the file's
:mod:`peerd.store.roundlog`'s, α and the weights the round's (:mod:`peerd.core.round`,
:mod:`peerd.learn.trainer`). A failing disk costs the audit, never the round: errors are
logged.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from peerd.control.audit import (
    AuditExpired,
    AuditLearner,
    AuditMember,
    AuditMode,
    AuditRefusal,
    AuditWithdrawn,
    RoundRecord,
    Verdict,
    audit_to_json,
    decode_lines,
    encode_record,
)
from peerd.core.entry import CacheItem
from peerd.core.modes import ModeName
from peerd.core.reasons import Reason
from peerd.core.staleness import Clock, StalenessMode
from peerd.learn.trainer import RoundOutput
from peerd.store.roundlog import RoundLog

log = logging.getLogger(__name__)

#: Distinct (peer, reason) pairs listed in one record: a flood of refusals from many
#: strangers' ids must not make a record (or the log) grow; the rest is counted in
#: ``refused_more``.
MAX_REFUSAL_ROWS = 64
#: Expired entries listed in one record (the cache holds at most C ≤ MAX_MEMBERS of them,
#: so this is a backstop): the rest is dropped from the list.
MAX_EXPIRED_ROWS = 400
#: Rules whose blend is per coordinate: no model has a weight in them.
_UNWEIGHTED = ("median", "trimmed")


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


class Participation:
    """One daemon's audit: the pending refusals and expiries, and the round log."""

    def __init__(self, state_path: Path, blend: str, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.blend = blend
        self._now = clock
        self.log: RoundLog | None
        try:
            self.log = RoundLog(state_path)
        except (OSError, ValueError) as exc:  # the audit must never stop the node
            log.warning("participation audit off: cannot use %s/rounds.log: %s",
                        state_path, exc)
            self.log = None
        self._refused: dict[tuple[str, str], int] = {}
        self._refused_more = 0
        self._expired: list[AuditExpired] = []
        self._withdrawn: list[AuditWithdrawn] = []
        #: The last round's record (the tracking sinks read the learner's metrics from it).
        self.last: RoundRecord | None = None

    # --- between rounds ------------------------------------------------------------------

    def refused(self, peer: str, reason: str, count: int = 1) -> None:
        """A session refused ``count`` entries of ``peer`` for ``reason``."""
        key = (peer, str(reason))
        if key in self._refused or len(self._refused) < MAX_REFUSAL_ROWS:
            self._refused[key] = self._refused.get(key, 0) + count
        else:
            self._refused_more += count

    def expired(self, origin: str, version: int) -> None:
        if len(self._expired) < MAX_EXPIRED_ROWS:
            self._expired.append(AuditExpired(origin, version))

    def withdrawn(self, origin: str, version: int, reason: str) -> None:
        """A held entry taken out of the blend: its origin was flagged (``equivocation``) or
        left the manifest (``revoked``, ``not_member``, ``expired``)."""
        if len(self._withdrawn) < MAX_EXPIRED_ROWS:  # one per cached origin: a backstop
            self._withdrawn.append(AuditWithdrawn(origin, version, reason))

    # --- each round ----------------------------------------------------------------------

    def weights_round(self, *, round_no: int, out: RoundOutput, own_id: str,
                      cache: Sequence[CacheItem], clock: Clock,
                      drift: Mapping[str, float], published: int | None,
                      learner: AuditLearner | None = None) -> RoundRecord:
        """Record a weight-mode round: the plan's members in plan order (own first), and
        what a learner of the user's returned (or why it was refused)."""
        metas = {i.meta.origin: i.meta for i in cache}
        verdicts = out.norm_verdicts or {}
        norms = out.update_norms or {}
        unweighted = self.blend.split(":", 1)[0].strip() in _UNWEIGHTED
        members = []
        for origin, alpha in out.alpha.items():
            verdict: Verdict = "accepted"
            if origin in verdicts:
                verdict = "rejected" if verdicts[origin] == "rejected" else "clipped"
            if out.weights is not None:
                weight: float | None = out.weights.get(origin, 0.0)
            elif verdict == "rejected":
                weight = 0.0
            else:
                weight = None if unweighted and len(out.alpha) > 1 else alpha
            meta = metas.get(origin)
            own = origin == own_id
            members.append(AuditMember(
                origin=origin, version=None if own or meta is None else meta.version,
                alpha=alpha, weight=weight,
                staleness=0.0 if own or meta is None else _finite(max(0.0,
                                                                      clock.staleness(meta))),
                drift=None if own else _finite(drift.get(origin)),
                update_norm=_finite(norms.get(origin)), verdict=verdict))
            if verdict == "rejected":
                self.refused(origin, str(Reason.UPDATE_NORM_TOO_LARGE))
        return self._append(round_no, "weights", self.blend, members, out.blend_refused,
                            published, learner)

    def typed_round(self, *, mode: ModeName, round_no: int, own_id: str,
                    used: Sequence[tuple[str, int, float]], clock: Clock,
                    published: int | None) -> RoundRecord:
        """Record a round of a mode that exchanges typed entries (knowledge, cordial views):
        the origins whose entries the round used (``(origin, version, created_at)``);
        distillation and views have no α or weights."""
        members = [AuditMember(origin=own_id, version=None, alpha=None, weight=None,
                               staleness=0.0, drift=None, update_norm=None,
                               verdict="accepted")]
        for origin, version, created_at in used:
            stamp = float(version) if clock.mode is StalenessMode.ROUNDS else created_at
            members.append(AuditMember(
                origin=origin, version=version, alpha=None, weight=None,
                staleness=_finite(max(0.0, clock.now - stamp)), drift=None, update_norm=None,
                verdict="accepted"))
        return self._append(round_no, cast(AuditMode, str(mode)), "none", members, None,
                            published)

    def _append(self, round_no: int, mode: AuditMode, blend: str,
                members: list[AuditMember], blend_refused: str | None,
                published: int | None, learner: AuditLearner | None = None) -> RoundRecord:
        refused = tuple(AuditRefusal(peer, reason, n)
                        for (peer, reason), n in sorted(self._refused.items()))
        record = RoundRecord(round=round_no, ts=round(self._now(), 3), mode=mode, blend=blend,
                             members=tuple(members), refused=refused,
                             refused_more=self._refused_more, expired=tuple(self._expired),
                             blend_refused=blend_refused, published=published,
                             withdrawn=tuple(self._withdrawn), learner=learner)
        self._refused, self._refused_more, self._expired = {}, 0, []
        self._withdrawn = []
        self.last = record
        if self.log is not None:
            try:
                self.log.append(round_no, encode_record(record))
            except (OSError, ValueError) as exc:
                log.warning("round %d: cannot append to the participation audit: %s",
                            round_no, exc)
        return record

    # --- the control API -----------------------------------------------------------------

    def answer(self, since: int | None) -> dict[str, Any]:
        """The control API's ``audit`` result (from memory: no disk read on the loop)."""
        lines = [] if self.log is None else self.log.records(since)
        return audit_to_json(decode_lines(lines, "daemon"))
