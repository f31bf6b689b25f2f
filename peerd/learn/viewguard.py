"""A cordial round that cannot be blown up by a peer's view (issue 24 item 2).

The view bound (peerd.core.viewbound.ViewBound) refuses views far larger than their agent's
usual ones; a view within it can still make the two-time-scale step diverge (constant +10 rows
for a sensor agent whose h_j are ~1.4: its held-out loss 3.5 -> 2e19 in one round). So the
round is checked by its effect: the loss on the round's views before and after its training
(:func:`peerd.core.viewbound.loss_exploded`). When it exploded, the learner is put back to
where the round started and the round is run again without one peer agent's view at a time;
the first that trains sanely names the culprit. If none does, the round runs on no view.

Costs one snapshot copy and two loss evaluations a healthy round (the rollback only when a
round exploded). Must not touch the node state or the network: the daemon's mode drops the
refused agents' views.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import numpy as np

from peerd.core.viewbound import loss_exploded
from peerd.learn.cordialround import PeerView
from peerd.store.learnerfile import LearnerState

T = TypeVar("T")


class GuardedLearner(Protocol):
    def snapshot(self, round_no: int) -> LearnerState: ...
    def load(self, saved: LearnerState) -> None: ...
    def loss(self, views: list[PeerView]) -> float: ...


def _copy(state: LearnerState) -> LearnerState:
    # snapshot() hands out views of the live tensors: training would change them under us
    return LearnerState(state.mode, state.identity, state.round, dict(state.counts),
                        {k: np.array(v, copy=True) for k, v in state.tensors.items()},
                        state.bfloat16)


def guarded_round(learner: GuardedLearner, run: Callable[[list[PeerView]], T],
                  views: list[PeerView]) -> tuple[T, list[int]]:
    """``run(views)``, unless its training explodes the loss; then the round again from the
    same start without the view that did it. The output and the agents whose views were
    refused (empty when the round was sane)."""
    start = _copy(learner.snapshot(0))
    before = learner.loss(views)
    out = run(views)
    if not views or not loss_exploded(before, learner.loss(views)):
        return out, []
    try:
        for v in views:
            rest = [w for w in views if w.agent != v.agent]
            learner.load(start)
            before = learner.loss(rest)
            out = run(rest)
            if not loss_exploded(before, learner.loss(rest)):
                return out, [v.agent]
        learner.load(start)
    except (ValueError, RuntimeError):
        # A start the learner itself refuses (it had diverged before this round): nothing
        # to go back to; the learner file check catches it at the next start.
        return out, []
    return run([]), [v.agent for v in views]
