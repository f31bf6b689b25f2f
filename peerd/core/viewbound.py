"""A bound on a cordial peer's view that adapts to that agent, as update-norm validation adapts
to the fleet (:mod:`peerd.core.updatenorm`).

The wire bound on a view's values (``MAX_VIEW_ABS``, ±1,000) only keeps numbers finite: a view
of ±10 where the agent's h_j are ~1 is admitted and, fed to the coordination layers Λ_j^i, took
an agent's loss from 0.02 to 3e8 (issue 24). What tells such a view from a good one is its
size against that agent's own history.

**The measure.** A view's scale is its largest row norm, max_k ‖h_j[k]‖₂ (float64): one
poisoned row is as visible as all of them, which a mean would dilute.

**The bound.** ``multiple × max(median, own, floor)``: ``median`` is that of the last
``window`` scales accepted from that agent (the median, not the mean: one large view must not
raise the bar for the next), ``own`` the own view's scale (the own h_i is trusted and of the
same kind: every agent embeds into the same width, and it grows with training as the peers'
do: Pairwise-10's largest row norm went 0.3 -> 4 -> 22 in its first 10 rounds, faster than a
median of past views follows), and the ``floor`` keeps a fresh agent whose h_i are still near
zero from refusing every peer. Only accepted views enter the history, so an attacker cannot
ratchet the bound up.

**Training on it.** A view within the bound can still blow a learner up: +10 on every row,
7× a sensor agent's scale, took agent 0's held-out loss from 3.5 to 2e19 within one round of
10 steps. :func:`loss_exploded` is the learner's own alarm (peerd.learn.viewguard): the loss
on the round's views after the round's training against the loss before it; a healthy round
lowers it or moves it by a little, a poisoned one by orders of magnitude.

Pure and deterministic: a value the caller keeps (the daemon's mode, in memory); no torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

#: 10× the reference: a Pairwise-10 or sensor agent's largest row norm moves by a few percent a
#: round; the issue's attack rows were ~10× the agents' scale and more.
DEFAULT_MULTIPLE = 10.0
#: How much a round's training may raise the loss on its own views: 100×, "orders of
#: magnitude" (a healthy round lowers it; a round's batches move it by a few × at most).
DEFAULT_LOSS_FACTOR = 100.0
#: Losses are compared above this, so a near-zero loss's noise is not a 100× jump.
LOSS_FLOOR = 1e-6
#: Accepted scales remembered per agent (a few minutes of rounds).
DEFAULT_WINDOW = 16
#: Least reference: h_i of a freshly drawn agent can be ~0.1; below 1 every bound is 10.
DEFAULT_FLOOR = 1.0


def view_scale(vectors: npt.NDArray[np.floating]) -> float:
    """max_k ‖vectors[k]‖₂ in float64 (0 for an empty view; inf if any value is not finite)."""
    if vectors.size == 0:
        return 0.0
    v = vectors.astype(np.float64, copy=False)
    if not bool(np.isfinite(v).all()):
        return math.inf
    return float(np.sqrt(np.max(np.sum(v * v, axis=-1))))


@dataclass
class ViewBound:
    """Per peer agent, the recent accepted scales; :meth:`admit` decides and records."""

    multiple: float = DEFAULT_MULTIPLE
    window: int = DEFAULT_WINDOW
    floor: float = DEFAULT_FLOOR
    history: dict[int, list[float]] = field(default_factory=dict)

    def bound(self, agent: int, own_scale: float) -> float:
        seen = self.history.get(agent)
        reference = max(statistics.median(seen) if seen else 0.0, own_scale, self.floor)
        if not math.isfinite(reference):  # a diverged own view must not lift the bound
            reference = self.floor
        return self.multiple * reference

    def admit(self, agent: int, scale: float, own_scale: float) -> bool:
        """Whether agent ``agent``'s view of ``scale`` may be used; if so it joins the history."""
        if not scale <= self.bound(agent, own_scale):  # NaN and inf are refused too
            return False
        seen = self.history.setdefault(agent, [])
        seen.append(scale)
        del seen[:-self.window]
        return True


def loss_exploded(before: float, after: float, factor: float = DEFAULT_LOSS_FACTOR) -> bool:
    """Whether a round's training took the loss from ``before`` to ``after`` by more than
    ``factor`` (or to NaN/Inf). A ``before`` that is not finite judges nothing but ``after``."""
    if not math.isfinite(after):
        return True
    if not math.isfinite(before):
        return False
    return after > factor * max(before, LOSS_FLOOR)
