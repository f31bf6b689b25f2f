"""Who is in this round's blend and with what α: the glue between cache and blend.

The own model is always member 0 with staleness 0 (it is current by definition); peers follow
in cache order. A peer whose clock runs slightly ahead can show a small negative age (the
validator bounds that skew); it counts as age 0 rather than being rewarded for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from peerd.core.alpha import AlphaPolicy, Member, Weights, alpha_weights
from peerd.core.entry import CacheItem, EntryMeta
from peerd.core.staleness import Clock


def blend_plan(
    own: EntryMeta,
    cache: Sequence[CacheItem],
    clock: Clock,
    policy: AlphaPolicy,
) -> tuple[tuple[str, ...], Weights]:
    """Origins (own first) and their α for blending own model with the cached peer models."""
    metas = [own, *(item.meta for item in cache)]
    members = [Member(own.num_examples, 0.0)]
    members += [Member(m.num_examples, max(0.0, clock.staleness(m))) for m in metas[1:]]
    return tuple(m.origin for m in metas), alpha_weights(policy, members)
