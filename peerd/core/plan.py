"""Who is in a blend and with what α: the first step of a round (:mod:`peerd.core.round`).

Owns the blend plan only: members and weights. It never touches a model (the caller's blend
does) and reads only metadata: origin, example count and age.

The own model is always member 0 with staleness 0 (it is current by definition); peers follow
in cache order. A peer whose clock runs slightly ahead can show a small negative age (the
validator bounds that skew); it counts as age 0 rather than being rewarded for it. With an
empty cache there is nothing to blend: the plan is the own model alone with α = 1, whatever
the policy (a policy can only rescale one weight to 1 anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peerd.core.alpha import AlphaPolicy, Member, alpha_weights
from peerd.core.entry import CacheItem, EntryMeta
from peerd.core.staleness import Clock


@dataclass(frozen=True, slots=True)
class BlendPlan:
    """One agent's blend: ``origins[0]`` is its own model, the rest its cache in cache order."""

    origins: tuple[str, ...]
    alpha: tuple[float, ...]  # same order as origins; non-negative, sums to 1

    @property
    def alone(self) -> bool:
        """Nothing to blend: the model stays as it is (α = 1 for the own model)."""
        return len(self.origins) == 1

    def as_dict(self) -> dict[str, float]:
        """origin -> α (what the daemon reports in its status)."""
        return dict(zip(self.origins, self.alpha, strict=True))


def blend_plan(
    own: EntryMeta,
    cache: Sequence[CacheItem],
    clock: Clock,
    policy: AlphaPolicy,
) -> BlendPlan:
    """Origins (own first) and their α for blending own model with the cached peer models."""
    if not cache:
        return BlendPlan((own.origin,), (1.0,))
    metas = [own, *(item.meta for item in cache)]
    members = [Member(own.num_examples, 0.0)]
    members += [Member(m.num_examples, max(0.0, clock.staleness(m))) for m in metas[1:]]
    weights = alpha_weights(policy, members)
    return BlendPlan(tuple(m.origin for m in metas), tuple(float(w) for w in weights))
