"""What the daemon carries from one weight-mode round to the next for update-norm
validation, and what it does with a round's verdicts.

The decision is pure and lives in :mod:`peerd.core.updatenorm` (the bound, the gate) and
:mod:`peerd.core.round` (which entries were rejected or clipped). This module only keeps the
recent update norms in memory (a restart starts cold, as documented), counts a rejection
under its reason, writes the audit events and logs a robust rule that blended nothing. It
must not decide anything.
"""

from __future__ import annotations

import logging
import math

from peerd.core.reasons import Reason
from peerd.core.updatenorm import NO_HISTORY, NormHistory, UpdateNormPolicy, Verdict
from peerd.learn.trainer import RoundOutput
from peerd.node.state import NodeState
from peerd.store.statedir import StateDir

log = logging.getLogger(__name__)


class NormWatch:
    """The update norms seen at recent blends: the fleet-adaptive bound's median."""

    def __init__(self, policy: UpdateNormPolicy) -> None:
        self.policy = policy
        self.history: NormHistory = NO_HISTORY

    def record(self, out: RoundOutput, node: NodeState, state: StateDir, blend: str) -> None:
        """After a round (loop thread): remember its norms, count and audit its verdicts."""
        if out.update_norms is not None:
            self.history = self.history.seen(list(out.update_norms.values()), self.policy)
        for origin, verdict in (out.norm_verdicts or {}).items():
            norm = (out.update_norms or {}).get(origin, math.nan)
            if verdict is Verdict.REJECTED:
                node.reject(Reason.UPDATE_NORM_TOO_LARGE)
            state.audit(f"update_norm_{verdict}", origin=origin, norm=norm)
        if out.blend_refused is not None:
            log.warning("round %d: blend = %s blended nothing: %s", node.round, blend,
                        out.blend_refused)
