"""The simulated algorithms as fleets: what each agent blends, through the core's blend step."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

from peerd.core.alpha import AlphaPolicy
from peerd.core.round import blend_step
from peerd.sim.algorithms import (
    DFL,
    CachedDFL,
    CacheStats,
    Contacts,
    Fleet,
    ModelBank,
    make_fleet,
    origin_id,
)

UNIFORM = AlphaPolicy.parse("uniform")


def _pairs(*pairs: tuple[int, int]) -> np.ndarray:
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


def cached(n: int, dim: int, *, capacity: int, tau_max: float,
           policy: AlphaPolicy = UNIFORM, lazy: bool = True) -> CachedDFL:
    return CachedDFL(torch.zeros(n, dim), [1] * n, capacity=capacity, tau_max=tau_max,
                     policy=policy, lazy=lazy)


def aggregate(fleet: Fleet, trained: torch.Tensor, t: int,
              ticks: Sequence[np.ndarray] = ()) -> tuple[torch.Tensor, CacheStats | None]:
    """Round ``t``'s trained models published, the round's contacts, then the blend that
    closes the round (in a run, the one that opens the next)."""
    met = np.zeros((fleet.n, fleet.n), dtype=bool)
    for pairs in ticks:
        met[pairs[:, 0], pairs[:, 1]] = True
    met |= met.T
    fleet.publish(trained, t, Contacts(ticks, met))
    blend_step(fleet.agents(), clock=fleet.clock, policy=fleet.policy, ops=fleet)
    return fleet.matrix, fleet.stats()


def test_model_bank_keeps_rows_compact() -> None:
    bank = ModelBank(3)
    bank.add_many([(0, 0), (1, 0), (2, 0)], torch.arange(9.0).reshape(3, 3))
    bank.retain({(2, 0), (1, 0)})
    assert len(bank) == 2
    assert torch.equal(bank.occupied[bank.row((2, 0))], torch.tensor([6.0, 7.0, 8.0]))
    assert torch.equal(bank.occupied[bank.row((1, 0))], torch.tensor([3.0, 4.0, 5.0]))
    bank.add_many([(0, 1)], torch.ones(1, 3))
    assert torch.equal(bank.occupied[bank.row((0, 1))], torch.ones(3))


def test_relay_carries_a_model_to_an_agent_never_met() -> None:
    # 0 meets 1 in tick 1, then 1 meets 2 in tick 2: agent 2 ends with 0's model (relay).
    sim = cached(3, 1, capacity=5, tau_max=5)
    trained = torch.tensor([[0.0], [3.0], [6.0]])
    blended, stats = aggregate(sim, trained, 0, [_pairs((0, 1)), _pairs((1, 2))])
    assert stats is not None
    origins = [{item.meta.origin for item in c} for c in sim.caches]
    assert origins[2] == {origin_id(0), origin_id(1)}
    assert origins[1] == {origin_id(0), origin_id(2)}
    assert origins[0] == {origin_id(1)}  # 0 left before 2 was met
    # Uniform blend of own + cache.
    assert blended[:, 0].tolist() == pytest.approx([1.5, 3.0, 3.0])
    assert stats.avg_models == pytest.approx(5 / 3)
    assert stats.avg_age == 0.0


def test_capacity_and_staleness_are_applied() -> None:
    sim = cached(4, 1, capacity=1, tau_max=1)
    trained = torch.arange(4.0).reshape(4, 1)
    aggregate(sim, trained, 0, [_pairs((0, 1), (0, 2), (0, 3))])
    assert len(sim.caches[0]) == 1  # C = 1 although three peers were met
    # Rounds pass without contacts: entries age and vanish after tau_max = 1.
    _, stats1 = aggregate(sim, trained, 1)
    assert stats1 is not None
    assert stats1.avg_age == 1.0
    assert len(sim.caches[0]) == 1
    blended, stats2 = aggregate(sim, trained, 2)
    assert stats2 is not None
    assert stats2.avg_models == 0.0
    assert np.isnan(stats2.avg_age)
    assert torch.equal(blended, trained)  # alone again: own model only
    assert len(sim.bank) == 0  # nothing references old models: the bank is empty


def test_fresher_version_replaces_older_one() -> None:
    sim = cached(2, 1, capacity=3, tau_max=5)
    aggregate(sim, torch.tensor([[0.0], [10.0]]), 0, [_pairs((0, 1))])
    blended, _ = aggregate(sim, torch.tensor([[0.0], [20.0]]), 1, [_pairs((0, 1))])
    assert [i.meta.version for i in sim.caches[0]] == [1]
    assert blended[0, 0].item() == pytest.approx(10.0)


def test_cached_dfl_is_deterministic_and_merges_lazily() -> None:
    rng = np.random.default_rng(0)
    ticks = [_pairs(*rng.integers(0, 6, size=(3, 2)).tolist()) for _ in range(20)]
    ticks = [t[t[:, 0] < t[:, 1]] for t in ticks]
    trained = torch.from_numpy(rng.normal(size=(6, 4))).float()
    # Contacts last several ticks: repeat each tick's pairs three times.
    ticks = [t for t in ticks for _ in range(3)]
    lazy = cached(6, 4, capacity=2, tau_max=3)
    again = cached(6, 4, capacity=2, tau_max=3)
    eager = cached(6, 4, capacity=2, tau_max=3, lazy=False)
    for t in range(3):
        out_lazy, stats_lazy = aggregate(lazy, trained + t, t, ticks)
        out_again, _ = aggregate(again, trained + t, t, ticks)
        out_eager, stats_eager = aggregate(eager, trained + t, t, ticks)
        assert torch.equal(out_lazy, out_again)
        # Skipping exchanges where neither cache changed is exact, and saves merges.
        assert torch.equal(out_lazy, out_eager)
        assert stats_lazy == stats_eager
    assert lazy.merges < eager.merges / 2


def test_dfl_blends_only_with_agents_met() -> None:
    trained = torch.tensor([[0.0], [2.0], [4.0], [9.0]])
    ticks = [_pairs((0, 1)), _pairs((1, 2))]
    out, stats = aggregate(DFL(torch.zeros(4, 1), [1, 1, 1, 1], UNIFORM), trained, 0, ticks)
    assert out[:, 0].tolist() == pytest.approx([1.0, 2.0, 3.0, 9.0])
    assert stats is None  # no cache to report on
    examples = DFL(torch.zeros(4, 1), [3, 1, 1, 1], AlphaPolicy.parse("examples"))
    weighted, _ = aggregate(examples, trained, 0, ticks)
    assert weighted[0, 0].item() == pytest.approx(0.5)
    # The next round's contacts replace the last: nobody met, everybody alone.
    alone, _ = aggregate(examples, trained + 1, 1)
    assert torch.equal(alone, trained + 1)


def test_fedavg_gives_everyone_the_example_weighted_mean() -> None:
    trained = torch.tensor([[0.0, 1.0], [4.0, 1.0], [2.0, 1.0]])
    # The configured policy is not FedAvg's: it always weights by example count.
    fleet = make_fleet("fedavg", torch.zeros(3, 2), [3, 1, 0], policy=UNIFORM, capacity=0,
                       tau_max=0)
    out, _ = aggregate(fleet, trained, 0)
    assert out.tolist() == [[1.0, 1.0]] * 3


def test_isolated_agents_keep_their_trained_models() -> None:
    fleet = make_fleet("isolated", torch.zeros(2, 1), [1, 1], policy=UNIFORM, capacity=3,
                       tau_max=5)
    trained = torch.tensor([[1.0], [5.0]])
    out, _ = aggregate(fleet, trained, 0, [_pairs((0, 1))])
    assert torch.equal(out, trained)


@pytest.mark.parametrize("algorithm", ["cached-dfl", "dfl", "fedavg", "isolated"])
def test_before_anything_is_published_every_agent_keeps_the_initial_model(
    algorithm: str,
) -> None:
    init = torch.tensor([[1.0], [2.0], [3.0]])
    fleet = make_fleet(algorithm, init.clone(), [1, 2, 3], policy=UNIFORM, capacity=3,
                       tau_max=5)
    plans = blend_step(fleet.agents(), clock=fleet.clock, policy=fleet.policy, ops=fleet)
    assert all(p.alone for p in plans)
    assert [p.origins[0] for p in plans] == [origin_id(a) for a in range(3)]
    assert torch.equal(fleet.matrix, init)


def test_staleness_policy_down_weights_older_cached_models() -> None:
    # Round 0: 0 and 1 meet. Round 1: no contact, so 0 blends its fresh own model (age 0)
    # with 1's round-0 model (age 1): (1+s)^-1 gives raw weights 1 and 1/2.
    sim = cached(2, 1, capacity=2, tau_max=5, policy=AlphaPolicy.parse("staleness:poly:1"))
    aggregate(sim, torch.tensor([[0.0], [3.0]]), 0, [_pairs((0, 1))])
    blended, stats = aggregate(sim, torch.tensor([[6.0], [9.0]]), 1)
    assert stats is not None
    assert stats.avg_age == 1.0
    assert blended[0, 0].item() == pytest.approx((6.0 * 1 + 3.0 * 0.5) / 1.5)
