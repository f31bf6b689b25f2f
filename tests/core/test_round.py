"""The core round's order and decisions: α from the plan, own model first, x̄, publish only
past ε, ρ = 0 as plain SGD, an empty cache, determinism given a seed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

from peerd.core.alpha import AlphaPolicy, Member, alpha_weights
from peerd.core.blend import blend
from peerd.core.entry import CacheItem, Entry
from peerd.core.local_update import LocalResult, local_update, sample_batches
from peerd.core.plan import BlendPlan, blend_plan
from peerd.core.round import (
    Anchor,
    PublishRule,
    RoundAgent,
    anchor_for,
    blend_step,
    cached_dfl_round,
)
from peerd.core.staleness import Clock
from tests.core.helpers import item, meta

UNIFORM = AlphaPolicy.parse("uniform")
EXAMPLES = AlphaPolicy.parse("examples")


@dataclass
class Recorder:
    """Ops that only record what the round asked for, in order."""

    calls: list[str] = field(default_factory=list)
    plans: tuple[BlendPlan, ...] = ()
    anchors: tuple[Anchor, ...] = ()

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        self.calls.append("blend")
        self.plans = tuple(plans)

    def train(self, anchors: Sequence[Anchor]) -> str:
        self.calls.append("train")
        self.anchors = tuple(anchors)
        return "trained"


def agent(origin: str, *peers: CacheItem, examples: int = 100,
          published: bool = False) -> RoundAgent:
    return RoundAgent(meta(origin, 5, examples=examples), tuple(peers), published=published)


def test_alpha_comes_from_the_plan_with_the_own_model_first() -> None:
    ops = Recorder()
    peers = (item("b", 4), item("c", 2))
    me = RoundAgent(meta("a", 5, examples=300), peers)
    out = cached_dfl_round([me], clock=Clock.rounds(5), policy=EXAMPLES, rho=0.0, ops=ops)
    (plan,) = out.plans
    assert ops.plans == out.plans
    assert plan.origins == ("a", "b", "c")  # own first, then the cache in cache order
    expected = alpha_weights(EXAMPLES, [Member(300, 0.0), Member(100, 1.0), Member(100, 3.0)])
    assert plan.alpha == tuple(expected.tolist()) == (0.6, 0.2, 0.2)
    assert plan.as_dict() == {"a": 0.6, "b": 0.2, "c": 0.2}
    assert ops.calls == ["blend", "train"]
    assert out.trained == "trained"


def test_the_own_model_has_age_zero_and_a_peer_ahead_counts_as_fresh() -> None:
    own = Entry.create(origin="me", version=7, created_at=100, num_examples=30,
                       params={"w": torch.zeros(2)})
    peer = meta("C2", 3, created_at=90)
    ahead = meta("C3", 9, created_at=120)
    cache = [CacheItem(peer, "C2", 95.0), CacheItem(ahead, "C3", 96.0)]
    plan = blend_plan(own.meta, cache, Clock.time(100.0), AlphaPolicy.parse("staleness:poly:1"))
    assert plan.origins == ("me", "C2", "C3")
    raw = [1.0, 1 / 11, 1.0]  # own: s=0; C2: s=10; C3 is 20 s ahead: counted as s=0
    assert list(plan.alpha) == pytest.approx([r / sum(raw) for r in raw])


def test_an_empty_cache_blends_nothing_and_never_asks_the_policy() -> None:
    # No example at all would make the "examples" policy raise (all-zero weights); alone,
    # the own model simply stays: α = 1.
    ops = Recorder()
    out = cached_dfl_round([agent("a", examples=0)], clock=Clock.rounds(5), policy=EXAMPLES,
                           rho=0.1, ops=ops)
    (plan,) = out.plans
    assert plan.alone
    assert plan.origins == ("a",)
    assert plan.alpha == (1.0,)
    assert ops.calls == ["blend", "train"]  # the op is told, and may skip an alone plan
    assert out.anchors == (Anchor.BLEND,)  # never published: x̄ must be kept


@pytest.mark.parametrize(
    ("rho", "has_peer", "published", "anchor"),
    [
        (0.0, False, True, Anchor.NONE),  # plain SGD holds no x̄ at all
        (0.0, True, False, Anchor.NONE),
        (0.5, False, True, Anchor.PUBLISHED),  # nothing blended: x̄ is the published entry
        (0.5, False, False, Anchor.BLEND),  # the model moved since it was published
        (0.5, True, True, Anchor.BLEND),  # blended: x̄ is the blend, not the entry
    ],
)
def test_the_anchor(rho: float, has_peer: bool, published: bool, anchor: Anchor) -> None:
    me = agent("a", *([item("b", 4)] if has_peer else []), published=published)
    ops = Recorder()
    out = cached_dfl_round([me], clock=Clock.rounds(5), policy=UNIFORM, rho=rho, ops=ops)
    assert out.anchors == ops.anchors == (anchor,)
    assert anchor_for(me, out.plans[0], rho) is anchor


def test_publish_only_when_the_model_moved_more_than_epsilon() -> None:
    agents = [agent(x) for x in "abcd"]
    seen: list[object] = []

    def drift(trained: str) -> list[float]:
        seen.append(trained)
        return [0.4, 0.5, 0.6, math.inf]  # inf: never published

    rule = PublishRule(0.5, drift)
    out = cached_dfl_round(agents, clock=Clock.rounds(5), policy=UNIFORM, rho=0.0,
                           ops=Recorder(), rule=rule)
    assert seen == ["trained"]  # measured once, on what training returned
    assert out.drift == (0.4, 0.5, 0.6, math.inf)
    assert out.publish == (False, False, True, True)  # strictly more than ε
    always = cached_dfl_round(agents, clock=Clock.rounds(5), policy=UNIFORM, rho=0.0,
                              ops=Recorder(), rule=PublishRule(0.0, lambda _: [0.0] * 4))
    assert always.publish == (True,) * 4  # ε = 0: every round publishes, even unmoved
    plain = cached_dfl_round(agents, clock=Clock.rounds(5), policy=UNIFORM, rho=0.0,
                             ops=Recorder())
    assert plain.drift is None  # no rule: nothing measured
    assert plain.publish == (True,) * 4


def test_a_quiet_agent_republishes_once_its_last_entry_is_max_silence_old() -> None:
    # Issue 12, item 3: below ε an agent used to stay silent forever, and peers dropped its
    # last entry after τ_max. Agents: moved (publishes anyway), quiet and fresh, quiet and
    # exactly due, quiet and long overdue, quiet with its last entry in the future (clock
    # stepped back: that timestamp is wrong either way, so a fresh entry is due).
    agents = [agent(x) for x in "abcde"]
    rule: PublishRule[str] = PublishRule(0.5, lambda _: [0.9, 0.1, 0.1, 0.0, 0.1],
                       silent_for=(10.0, 299.9, 300.0, 5000.0, -60.0), max_silence=300.0)
    out = cached_dfl_round(agents, clock=Clock.time(1e6), policy=UNIFORM, rho=0.0,
                           ops=Recorder(), rule=rule)
    assert out.drift == (0.9, 0.1, 0.1, 0.0, 0.1)  # still measured and reported
    assert out.publish == (True, False, True, True, True)
    # Without a limit (the default) a quiet agent stays quiet however long it has been.
    quiet = cached_dfl_round(agents[:1], clock=Clock.time(1e6), policy=UNIFORM, rho=0.0,
                             ops=Recorder(), rule=PublishRule(0.5, lambda _: [0.1],
                                                              silent_for=(1e9,)))
    assert quiet.publish == (False,)
    with pytest.raises(ValueError, match="2 silences for 1 agents"):
        cached_dfl_round(agents[:1], clock=Clock.time(1e6), policy=UNIFORM, rho=0.0,
                         ops=Recorder(), rule=PublishRule(0.5, lambda _: [0.1],
                                                          silent_for=(1.0, 2.0)))


def test_a_bad_drift_or_a_bad_round_is_refused() -> None:
    me, clock = [agent("a")], Clock.rounds(5)
    with pytest.raises(ValueError, match="NaN"):
        cached_dfl_round(me, clock=clock, policy=UNIFORM, rho=0.0, ops=Recorder(),
                         rule=PublishRule(0.1, lambda _: [math.nan]))
    with pytest.raises(ValueError, match="2 drifts for 1 agents"):
        cached_dfl_round(me, clock=clock, policy=UNIFORM, rho=0.0, ops=Recorder(),
                         rule=PublishRule(0.1, lambda _: [1.0, 2.0]))
    ops = Recorder()
    with pytest.raises(ValueError, match="at least one agent"):
        cached_dfl_round([], clock=clock, policy=UNIFORM, rho=0.0, ops=ops)
    with pytest.raises(ValueError, match="rho"):
        cached_dfl_round(me, clock=clock, policy=UNIFORM, rho=-1.0, ops=ops)
    assert ops.calls == []  # refused before anything was blended


# --------------------------------------------------------------------- with real models
X = torch.randn(40, 3, generator=torch.Generator().manual_seed(1))
Y = (X.sum(dim=1) > 0).long()


def linear(seed: int) -> nn.Linear:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nn.Linear(3, 2)


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@dataclass
class ModuleOps:
    """A minimal caller: nn.Modules blended as stacked copies, trained with local_update."""

    models: list[nn.Module]
    peers: list[list[Mapping[str, torch.Tensor]]]
    published: list[Mapping[str, torch.Tensor] | None]
    seed: int
    rho: float

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        for model, peers, plan in zip(self.models, self.peers, plans, strict=True):
            if not plan.alone:
                model.load_state_dict(blend([params(model), *peers], plan.alpha))

    def train(self, anchors: Sequence[Anchor]) -> list[LocalResult]:
        out = []
        for i, (model, anchor) in enumerate(zip(self.models, anchors, strict=True)):
            x_bar = self.published[i] if anchor is Anchor.PUBLISHED else None
            out.append(local_update(model, X, Y, steps=6, batch_size=8, lr=0.2, rho=self.rho,
                                    loss="cross_entropy", anchor=x_bar,
                                    generator=torch.Generator().manual_seed(self.seed + i)))
        return out


def run_mesh_round(seed: int, rho: float = 0.1) -> list[dict[str, torch.Tensor]]:
    models: list[nn.Module] = [linear(0), linear(1)]
    entries = [Entry.create(origin=o, version=3, created_at=3.0, num_examples=40,
                            params=params(linear(s))) for o, s in (("p", 2), ("q", 3))]
    agents = [
        RoundAgent(meta("a", 4, examples=40),
                   tuple(CacheItem(e.meta, "x", 4.0) for e in entries)),
        RoundAgent(meta("b", 4, examples=40), (), published=True),
    ]
    ops = ModuleOps(models, [[e.params for e in entries], []], [None, params(models[1])],
                    seed, rho)
    out = cached_dfl_round(agents, clock=Clock.rounds(4), policy=UNIFORM, rho=rho, ops=ops)
    assert out.anchors == ((Anchor.BLEND, Anchor.PUBLISHED) if rho else (Anchor.NONE,) * 2)
    return [params(m) for m in models]


def test_the_same_seed_gives_the_same_round_and_another_seed_another() -> None:
    a, b, c = run_mesh_round(7), run_mesh_round(7), run_mesh_round(8)
    assert all(torch.equal(a[i][k], b[i][k]) for i in range(2) for k in a[i])
    assert not all(torch.equal(a[i][k], c[i][k]) for i in range(2) for k in a[i])


def test_rho_zero_is_plain_sgd_from_the_blend() -> None:
    (trained, _) = run_mesh_round(3, rho=0.0)
    # The reference: the blend of the three models, then torch's own SGD on the same batches.
    ref = linear(0)
    peers = [params(linear(2)), params(linear(3))]
    ref.load_state_dict(blend([params(ref), *peers], [1 / 3] * 3))
    opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    for idx in sample_batches(40, 8, 6, torch.Generator().manual_seed(3)):
        opt.zero_grad()
        nn.functional.cross_entropy(ref(X[idx]), Y[idx]).backward()  # type: ignore[no-untyped-call]
        opt.step()
    assert all(torch.equal(trained[k], v) for k, v in params(ref).items())


def test_blend_step_alone_plans_and_applies_without_training() -> None:
    ops = Recorder()
    plans = blend_step([agent("a", item("b", 4)), agent("c")], clock=Clock.rounds(5),
                       policy=UNIFORM, ops=ops)
    assert ops.calls == ["blend"]
    assert ops.plans == plans
    assert [p.origins for p in plans] == [("a", "b"), ("c",)]
