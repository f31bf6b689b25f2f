"""The daemon's blend with a robust rule and with update-norm validation: block-wise and in
place from separate entries, equal to the whole-stack functions of peerd.core."""

from __future__ import annotations

import torch

from peerd.core.alpha import AlphaPolicy
from peerd.core.blend import blend_rows
from peerd.core.entry import CacheItem, Entry
from peerd.core.plan import BlendPlan
from peerd.core.robust import Clipped, Krum, Median, RobustRule, Trimmed, robust_blend_rows
from peerd.core.staleness import Clock
from peerd.core.updatenorm import NormAction, NormHistory, UpdateNormPolicy, Verdict
from peerd.learn.trainer import RoundInput, _ModelOps, run_round
from tests.learn.test_tasks import Toy


def _flat(params: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([params["weight"].reshape(-1), params["bias"]])


def _setup(offsets: list[float], **kw: object) -> tuple[_ModelOps, BlendPlan, torch.Tensor]:
    task = Toy()
    model = task.model()
    own = {k: v.detach() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    peers = [Entry.create(origin=f"p{i}", version=1, created_at=90.0, num_examples=16,
                          params={k: v + off + 0.1 * torch.randn(v.shape, generator=g)
                                  for k, v in own.items()})
             for i, off in enumerate(offsets)]
    stack = torch.stack([_flat(own)] + [_flat(dict(p.params)) for p in peers])
    inp = RoundInput(own_id="me", cache=tuple(CacheItem(p.meta, p.meta.origin, 95.0)
                                              for p in peers),
                     peers=peers, clock=Clock.time(100.0), policy=AlphaPolicy.parse("uniform"),
                     steps=1, batch_size=4, lr=0.1, rho=0.0, seed=0, **kw)  # type: ignore[arg-type]
    ops = _ModelOps(model, own, task.data(), "cross_entropy", inp)
    n = len(peers) + 1
    plan = BlendPlan(("me", *(p.meta.origin for p in peers)), (1.0 / n,) * n)
    return ops, plan, stack


def test_the_daemons_robust_blend_equals_the_whole_stack_rule() -> None:
    rules: list[RobustRule] = [Median(), Trimmed(0.2), Clipped(0.3), Krum(1)]
    for rule in rules:
        ops, plan, stack = _setup([0.0, 0.1, -0.1, 5.0])
        want = robust_blend_rows(stack, plan.alpha, rule)
        ops.blend_robust([plan], rule)
        assert torch.allclose(_flat(ops.own_params), want, atol=1e-6), rule
        assert ops.inp.peers == []  # consumed, as in the weighted blend


def test_krum_with_too_few_models_blends_nothing_and_says_why() -> None:
    ops, plan, stack = _setup([0.0, 1.0])
    ops.blend_robust([plan], Krum(1))
    assert ops.refused is not None
    assert "2f + 2 = 4" in ops.refused
    assert torch.equal(_flat(ops.own_params), stack[0])


def test_update_norm_reject_leaves_the_far_peer_out_of_the_weighted_blend() -> None:
    policy = UpdateNormPolicy(NormAction.REJECT, multiple=3.0, window=8, min_history=3)
    history = NormHistory((0.3, 0.3, 0.3))  # bound 0.9: the peer 5.0 away is out
    ops, plan, stack = _setup([0.0, 0.05, 5.0], norm_policy=policy, norm_history=history)
    ops.blend([plan])
    assert ops.verdicts == {"p2": Verdict.REJECTED}
    assert ops.norms is not None
    assert ops.norms["p2"] > 5.0
    want = blend_rows(stack[:3], [1 / 3] * 3)
    assert torch.allclose(_flat(ops.own_params), want, atol=1e-6)


def test_update_norm_clip_scales_the_far_peer_to_the_bound() -> None:
    policy = UpdateNormPolicy(NormAction.CLIP, multiple=3.0, window=8, min_history=3)
    ops, plan, stack = _setup([0.0, 5.0], norm_policy=policy,
                              norm_history=NormHistory((0.3, 0.3, 0.3)))
    ops.blend([plan])
    assert ops.verdicts == {"p1": Verdict.CLIPPED}
    d = stack[2] - stack[0]
    clipped = stack[0] + d * (0.9 / float(d.double().norm()))
    want = (stack[0] + stack[1] + clipped) / 3
    assert torch.allclose(_flat(ops.own_params), want, atol=1e-6)


def test_run_round_reports_norms_and_a_median_blend() -> None:
    policy = UpdateNormPolicy(NormAction.CLIP, multiple=3.0, window=8, min_history=3)
    task = Toy()
    ops, _, _ = _setup([0.0, 0.1, 9.0], norm_policy=policy)  # cold: nothing bounded
    out = run_round(ops.model, task, RoundInput(**{**{f: getattr(ops.inp, f) for f in (
        "own_id", "cache", "peers", "clock", "policy", "steps", "batch_size", "lr", "rho",
        "seed", "norm_policy")}, "blend": Median()}))
    assert out.update_norms is not None
    assert set(out.update_norms) == {"p0", "p1", "p2"}
    assert out.norm_verdicts == {}
    assert out.blend_refused is None
