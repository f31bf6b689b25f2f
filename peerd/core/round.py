"""One Cached-DFL round: blend plan → α → blend → local update → publish decision.

This is the only place that orders a round. The daemon (:mod:`peerd.learn.trainer`), the
in-process demo (:mod:`peerd.mesh.inproc`) and the simulator (:mod:`peerd.sim`) all call
:func:`cached_dfl_round`; they share its order and its decisions and bring their own machinery
for the heavy steps as :class:`RoundOps` (Flower's strategy/client split, without a server):

* the daemon blends in place, column block by column block, drops its peer list as soon as it
  is blended, and keeps x̄ in a file or reuses its published entry (memory: one model);
* the simulator blends all agents in one matrix product and trains them all with vmap;
* the in-process mesh blends stacked copies and trains each node with ``local_update``.

So a round is batch-shaped: ``agents`` are all the models a caller advances together (the
daemon: one). What the round decides, per agent:

1. the blend plan (:func:`peerd.core.plan.blend_plan`): own model first, then the cache in
   cache order, α from the policy; an empty cache blends nothing;
2. x̄, the anchor of the proximal term (:class:`Anchor`);
3. whether the trained model is published: with a :class:`PublishRule`, only if it moved more
   than ε since its last published entry, or that entry is ``max_silence`` old
   (:func:`peerd.core.drift.should_publish`); without one (simulator, demo) every round
   publishes, as in the lecture's round.

**Policies.** A round is one blend policy and one local policy
(:class:`BlendPolicy`, :data:`LocalPolicy`):

* weight mode (the default): blend ``weighted`` (Σ α_j x_j over the cache) and local ``plain``
  (K proximal steps, ``ops.train``);
* knowledge mode (FedCache without a server): blend ``none`` (nothing is averaged: models may
  even differ in architecture) and local :class:`peerd.core.distill.Distillation` (CE + β·KL
  towards the knowledge cache's teachers, ``ops.distill``; the ops must be
  :class:`KnowledgeOps`).

* robust blends (:mod:`peerd.core.robust`: median, trimmed mean, self-centred clipping,
  Multi-Krum): the same plan and α, applied by ``ops.blend_robust`` (the ops must be
  :class:`RobustBlendOps`); :func:`parse_blend` reads the configured name.

* local :class:`peerd.core.fedbss.FedBSS` (weight mode): a curriculum over the local data,
  ``ops.curriculum`` (the ops must be :class:`CurriculumOps`).

Later policies (cordial local steps) are new values here, not new round functions.

What it must not do: touch a model, a file, a socket or a clock, or draw random numbers. Time
comes in as ``clock``, randomness inside the ops (each training carries its generator).

Exchanging entries is not part of a round: the daemon gossips between rounds, the simulator
and the demo swap caches at contacts after publishing. Their reports show each round's models
after aggregation, which is the blend that opens the next round; their last round is closed
by :func:`blend_step` alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, Protocol, TypeVar, runtime_checkable

from peerd.core.alpha import AlphaPolicy
from peerd.core.blendrules import RobustRule, parse_rule
from peerd.core.distill import Distillation
from peerd.core.drift import should_publish
from peerd.core.entry import CacheItem, EntryMeta
from peerd.core.fedbss import FedBSS
from peerd.core.plan import BlendPlan, blend_plan
from peerd.core.staleness import Clock

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True, slots=True)
class RoundAgent:
    """One agent going into a round."""

    #: Its own model's metadata: α reads the origin and the example count (never the digest).
    own: EntryMeta
    #: The peer models it holds, in cache order (metadata: the plan never reads tensors).
    cache: tuple[CacheItem, ...]
    #: Its model still equals its last published entry, bit for bit.
    published: bool = False


class Anchor(StrEnum):
    """x̄ for the proximal term ρ/2‖x − x̄‖² of one agent's local update."""

    #: ρ = 0: plain SGD, no anchor to hold.
    NONE = "none"
    #: Nothing was blended and the model is its published entry: that entry is x̄ (no copy).
    PUBLISHED = "published"
    #: x̄ is the model as the blend left it: the caller keeps it before training moves it.
    BLEND = "blend"


class BlendOps(Protocol):
    def blend(self, plans: Sequence[BlendPlan]) -> None:
        """Replace each agent's model by Σ α_j x_j over its plan's origins (own first, then its
        cache in cache order). An alone plan leaves the model as it is: the op may skip it."""


class RoundOps(BlendOps, Protocol[T_co]):
    def train(self, anchors: Sequence[Anchor]) -> T_co:
        """K proximal steps for every agent from its blended model, x̄ as ``anchors`` say.

        Returns what the caller needs afterwards (trained models, losses); the round hands it
        to the publish rule and back, unread."""


@runtime_checkable
class RobustBlendOps(Protocol):
    def blend_robust(self, plans: Sequence[BlendPlan], rule: RobustRule) -> None:
        """Replace each agent's model by ``rule`` over its plan's origins (own first), α as
        the plan says (:mod:`peerd.core.robust`). An alone plan may be skipped."""


@runtime_checkable
class KnowledgeOps(RoundOps[T_co], Protocol[T_co]):
    def distill(self, anchors: Sequence[Anchor], policy: Distillation) -> T_co:
        """One local epoch of distillation for every agent (teachers are the ops' business:
        its knowledge cache); returns what the caller needs afterwards, like ``train``."""


@runtime_checkable
class CurriculumOps(RoundOps[T_co], Protocol[T_co]):
    def curriculum(self, anchors: Sequence[Anchor], policy: FedBSS) -> T_co:
        """FedBSS local training for every agent (:mod:`peerd.core.fedbss`): warm-up rounds
        through the plain path, then score, peak split and E cosine-gated epochs; the
        per-agent warm-up state is the ops' business. Returns like ``train``."""


class BlendPolicy(StrEnum):
    """How a round combines the models an agent holds."""

    #: x = Σ α_j x_j over own model and cache, α from the :class:`AlphaPolicy` (weight mode).
    WEIGHTED = "weighted"
    #: Nothing is combined: every plan is the own model alone (knowledge mode).
    NONE = "none"


#: What ``blend`` may be: the plain policies or a robust rule (which carries its parameter).
Blend = BlendPolicy | RobustRule


def parse_blend(text: str) -> Blend:
    """``weighted`` | ``median`` | ``trimmed[:β]`` | ``clipped[:τ]`` | ``krum[:f]`` (ValueError
    naming what is wrong). ``none`` is knowledge mode's, never configured by name."""
    if text.strip() == BlendPolicy.WEIGHTED.value:
        return BlendPolicy.WEIGHTED
    return parse_rule(text)


@dataclass(frozen=True, slots=True)
class Plain:
    """The local policy of weight mode: K proximal SGD steps on the task loss."""


PLAIN = Plain()
#: How an agent trains after the blend.
LocalPolicy = Plain | Distillation | FedBSS


@dataclass(frozen=True, slots=True)
class PublishRule(Generic[T]):
    """Publish only models that moved more than ``epsilon`` since their last published entry,
    or whose last published entry is ``max_silence`` old (peers drop entries older than τ_max:
    a quiet agent must refresh its entry to stay in their blends)."""

    epsilon: float
    #: ‖x − x_published‖ per agent, from the training's result (``math.inf`` for an agent that
    #: never published: its first model always goes out).
    drift: Callable[[T], Sequence[float]]
    #: Per agent, the time since its last published entry, in ``max_silence``'s unit (the
    #: daemon: seconds since its own entry's ``created_at``); empty: nobody is overdue.
    silent_for: Sequence[float] = ()
    #: The longest silence allowed below ε; ``math.inf``: no limit.
    max_silence: float = math.inf


@dataclass(frozen=True, slots=True)
class RoundOutcome(Generic[T]):
    plans: tuple[BlendPlan, ...]
    anchors: tuple[Anchor, ...]
    trained: T  # what ops.train returned
    drift: tuple[float, ...] | None  # since the last publication; None: no rule, not measured
    publish: tuple[bool, ...]


def blend_step(
    agents: Sequence[RoundAgent], *, clock: Clock, policy: AlphaPolicy, ops: BlendOps,
    blend: BlendPolicy | RobustRule = BlendPolicy.WEIGHTED,
) -> tuple[BlendPlan, ...]:
    """Plan every agent's blend (α under ``policy`` at ``clock``) and have ``ops`` apply it
    (``ops.blend``; a robust rule: ``ops.blend_robust``).

    The first half of :func:`cached_dfl_round`; alone, it closes a simulation's last round."""
    plans = tuple(blend_plan(a.own, a.cache, clock, policy) for a in agents)
    if isinstance(blend, BlendPolicy):
        ops.blend(plans)
    elif isinstance(ops, RobustBlendOps):
        ops.blend_robust(plans, blend)
    else:
        raise TypeError(f"a {blend} blend needs RobustBlendOps (an ops.blend_robust)")
    return plans


def anchor_for(agent: RoundAgent, plan: BlendPlan, rho: float) -> Anchor:
    """Where x̄ comes from: nothing to hold at ρ = 0; the published entry when nothing was
    blended and the model still equals it; otherwise the blend itself."""
    if rho == 0:
        return Anchor.NONE
    if plan.alone and agent.published:
        return Anchor.PUBLISHED
    return Anchor.BLEND


def cached_dfl_round(
    agents: Sequence[RoundAgent],
    *,
    clock: Clock,
    policy: AlphaPolicy,
    rho: float,
    ops: RoundOps[T],
    rule: PublishRule[T] | None = None,
    blend: Blend = BlendPolicy.WEIGHTED,
    local: LocalPolicy = PLAIN,
) -> RoundOutcome[T]:
    """One round for every agent: plan → α → blend → local update → publish decision.

    ``blend`` and ``local`` choose the policies (module docstring); the defaults are the
    lecture's Cached-DFL round."""
    if not agents:
        raise ValueError("a round needs at least one agent")
    if not (math.isfinite(rho) and rho >= 0):
        raise ValueError(f"rho must be finite and >= 0, got {rho}")
    if blend is BlendPolicy.WEIGHTED:
        plans = blend_step(agents, clock=clock, policy=policy, ops=ops)
    elif blend is BlendPolicy.NONE:
        plans = tuple(BlendPlan((a.own.origin,), (1.0,)) for a in agents)
    elif not isinstance(blend, BlendPolicy):
        plans = blend_step(agents, clock=clock, policy=policy, ops=ops, blend=blend)
    else:
        raise ValueError(f"unknown blend policy {blend!r}")
    anchors = tuple(anchor_for(a, p, rho) for a, p in zip(agents, plans, strict=True))
    trained: T
    if isinstance(local, Distillation):
        if not isinstance(ops, KnowledgeOps):
            raise TypeError("a distillation round needs KnowledgeOps (an ops.distill)")
        trained = ops.distill(anchors, local)
    elif isinstance(local, Plain):
        trained = ops.train(anchors)
    elif isinstance(local, FedBSS):
        if not isinstance(ops, CurriculumOps):
            raise TypeError("a FedBSS round needs CurriculumOps (an ops.curriculum)")
        trained = ops.curriculum(anchors, local)
    else:
        raise ValueError(f"unknown local policy {local!r}")
    if rule is None:
        return RoundOutcome(plans, anchors, trained, None, (True,) * len(agents))
    moved = tuple(rule.drift(trained))
    if len(moved) != len(agents):
        raise ValueError(f"{len(moved)} drifts for {len(agents)} agents")
    silent = tuple(rule.silent_for) or (0.0,) * len(agents)
    if len(silent) != len(agents):
        raise ValueError(f"{len(silent)} silences for {len(agents)} agents")
    publish = tuple(should_publish(d, rule.epsilon, silent_for=s, max_silence=rule.max_silence)
                    for d, s in zip(moved, silent, strict=True))
    return RoundOutcome(plans, anchors, trained, moved, publish)
