"""Update-norm validation: how far a peer's model is from the own model, against a bound that
adapts to the fleet.

The whole-model norm bound (:mod:`peerd.core.validate`, ``max_norm``) cannot tell a large but
bounded poisoned model from a good one. What can is the *update*: u_j = x_j − x̄_own, the
difference between a peer's entry and the model it would be blended into. A healthy fleet's
updates have a typical size; an attacker's (sign-flip, scaled, gaussian) are much larger.

**The bound.** ``multiple × median(history)``, where ``history`` is the last ``window`` update
norms this node has seen (every member of every blend, accepted or not: the median is robust
while fewer than half the observations are bad, and recording refused ones keeps the bound
from ratcheting down when the fleet's updates legitimately grow). The median, not the mean:
one huge update must not raise the bar for the next.

**Cold start.** With fewer than ``min_history`` norms seen, there is no bound (only NaN/Inf and
the absolute ``max_norm`` apply): a fresh node cannot know its fleet's scale, and refusing its
first peers on a guess would keep it from ever learning one. ``min_history`` defaults to 8,
about one blend of a full cache (C = 10) or a few rounds of a small one.

**The action.** ``reject``: the entry is left out of the blend (its α goes to the others,
renormalised) and counted under :attr:`peerd.core.reasons.Reason.UPDATE_NORM_TOO_LARGE`;
``clip``: the update is scaled to the bound, x_own + (bound/‖u_j‖)·u_j, which in a weighted
blend is the weight α_j·s moved onto the own model (as :mod:`peerd.core.robust` clips).
Non-finite entries never get here: validation refuses them outright.

Pure: the history is an immutable value the caller keeps (the daemon, in memory); nothing here
reads a model (norms come in as floats, float64, from :mod:`peerd.core.robust`'s pass).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

#: Defaults: off unless configured; 4× the median update (a sign-flipped model of a converged
#: fleet is ~2× its own norm away, a healthy update well under the median's multiple).
DEFAULT_MULTIPLE = 4.0
DEFAULT_WINDOW = 64
DEFAULT_MIN_HISTORY = 8


class NormAction(StrEnum):
    OFF = "off"
    REJECT = "reject"
    CLIP = "clip"


class Verdict(StrEnum):
    ACCEPTED = "accepted"
    CLIPPED = "clipped"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class UpdateNormPolicy:
    action: NormAction = NormAction.OFF
    multiple: float = DEFAULT_MULTIPLE
    window: int = DEFAULT_WINDOW
    min_history: int = DEFAULT_MIN_HISTORY

    def __post_init__(self) -> None:
        if not (math.isfinite(self.multiple) and self.multiple > 0):
            raise ValueError(f"multiple must be finite and > 0, got {self.multiple}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if not 1 <= self.min_history <= self.window:
            raise ValueError(f"min_history must be in [1, window], got {self.min_history}")


@dataclass(frozen=True, slots=True)
class NormHistory:
    """The last update norms seen, oldest first (at most the policy's window)."""

    norms: tuple[float, ...] = ()

    def seen(self, norms: Sequence[float], policy: UpdateNormPolicy) -> NormHistory:
        """This history after ``norms`` (finite ones only), trimmed to the window."""
        kept = self.norms + tuple(float(n) for n in norms if math.isfinite(n))
        return NormHistory(kept[-policy.window:])


def update_bound(policy: UpdateNormPolicy, history: NormHistory) -> float:
    """The bound in force: ``multiple × median(history)``; ``inf`` when off or cold."""
    if policy.action is NormAction.OFF or len(history.norms) < policy.min_history:
        return math.inf
    return policy.multiple * statistics.median(history.norms)


#: Validation off, and nothing seen yet: the defaults a caller starts from.
NORM_OFF = UpdateNormPolicy()
NO_HISTORY = NormHistory()


@dataclass(frozen=True, slots=True)
class Gate:
    bound: float
    verdicts: tuple[Verdict, ...]  # per member, own first (always accepted)
    #: Per member, the factor its update is scaled by (1: untouched; 0: rejected).
    scale: tuple[float, ...]


def gate(dist: Sequence[float], policy: UpdateNormPolicy, history: NormHistory) -> Gate:
    """The verdict on each member's update norm ``dist[j]`` = ‖x_j − x_own‖ (row 0: own).

    Decided against the bound of ``history`` as it was before this blend, so a burst of bad
    entries in one blend cannot vouch for itself."""
    bound = update_bound(policy, history)
    verdicts: list[Verdict] = [Verdict.ACCEPTED]
    scale: list[float] = [1.0]
    for d in dist[1:]:
        if not math.isfinite(d):
            verdicts.append(Verdict.REJECTED)  # cannot happen after validation; be safe
            scale.append(0.0)
        elif d <= bound:
            verdicts.append(Verdict.ACCEPTED)
            scale.append(1.0)
        elif policy.action is NormAction.CLIP:
            verdicts.append(Verdict.CLIPPED)
            scale.append(bound / d)
        else:
            verdicts.append(Verdict.REJECTED)
            scale.append(0.0)
    return Gate(bound, tuple(verdicts), tuple(scale))


def gated_alpha(alpha: Sequence[float], g: Gate) -> list[float]:
    """α with rejected members removed and renormalised over the rest (own always stays).

    Clipped members keep their α: their rows are scaled towards the own model instead
    (:func:`scaled_weights` for a weighted blend)."""
    kept = [a if v is not Verdict.REJECTED else 0.0 for a, v in zip(alpha, g.verdicts,
                                                                    strict=True)]
    total = math.fsum(kept)
    if total <= 0:  # only rejected peers carried weight: the own model alone
        return [1.0] + [0.0] * (len(alpha) - 1)
    return [a / total for a in kept]


def scaled_weights(alpha: Sequence[float], scale: Sequence[float]) -> list[float]:
    """Weighted-blend weights for x_own + Σ α_j s_j (x_j − x_own): w_j = α_j s_j, the own
    model takes the rest."""
    w = [0.0] + [a * s for a, s in zip(alpha[1:], scale[1:], strict=True)]
    w[0] = max(0.0, 1.0 - math.fsum(w[1:]))
    return w
