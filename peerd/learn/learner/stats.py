"""What the daemon tells about its learner: failures by reason, the last one, the last fit's
metrics. Kept on the loop thread after every round; ``peerd status`` and Prometheus read it.

The metric names shown are bounded over the life of the process, not only per round: a
learner that reports ``loss_round_1``, ``loss_round_2``, … would otherwise mint a new
Prometheus series every round (each one kept by the monitoring server for its retention).
The first :data:`~peerd.learn.learner.check.MAX_METRICS` distinct names are admitted; later
new names are dropped and counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from peerd.learn.learner.check import MAX_METRICS
from peerd.learn.learner.contract import LearnerError, Refusal


@dataclass
class LearnerStats:
    kind: str
    entry: str | None
    device: str
    #: Rounds refused since start, by reason (every reason present, 0 included: a fixed set).
    failed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        (r.value for r in Refusal), 0))
    last_failure: str | None = None
    last_detail: str | None = None
    #: The node's round (from 1) of the last failure.
    last_failed_round: int | None = None
    #: The last successful fit's metrics (admitted names only).
    metrics: dict[str, float] = field(default_factory=dict)
    #: Metric values dropped because their name came after the first MAX_METRICS names.
    metrics_dropped: int = 0
    _admitted: set[str] = field(default_factory=set)

    def failed_round(self, round_no: int, exc: LearnerError) -> None:
        self.failed[exc.reason.value] += 1
        self.last_failure, self.last_detail = exc.reason.value, exc.detail
        self.last_failed_round = round_no

    def fitted(self, metrics: Mapping[str, float]) -> None:
        kept: dict[str, float] = {}
        for name, value in metrics.items():
            if name not in self._admitted and len(self._admitted) < MAX_METRICS:
                self._admitted.add(name)
            if name in self._admitted:
                kept[name] = float(value)
            else:
                self.metrics_dropped += 1
        self.metrics = kept
