from __future__ import annotations

import numpy as np
import pytest
import torch

from peerd.core.alpha import AlphaPolicy
from peerd.sim.algorithms import CachedDFL, ModelBank, dfl_round, fedavg_round, origin_id

UNIFORM = AlphaPolicy.parse("uniform")


def _pairs(*pairs: tuple[int, int]) -> np.ndarray:
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


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
    sim = CachedDFL(3, 1, [1, 1, 1], capacity=5, tau_max=5, policy=UNIFORM)
    trained = torch.tensor([[0.0], [3.0], [6.0]])
    blended, stats = sim.round(trained, 0, [_pairs((0, 1)), _pairs((1, 2))])
    origins = [{item.meta.origin for item in c} for c in sim.caches]
    assert origins[2] == {origin_id(0), origin_id(1)}
    assert origins[1] == {origin_id(0), origin_id(2)}
    assert origins[0] == {origin_id(1)}  # 0 left before 2 was met
    # Uniform blend of own + cache.
    assert blended[:, 0].tolist() == pytest.approx([1.5, 3.0, 3.0])
    assert stats.avg_models == pytest.approx(5 / 3)
    assert stats.avg_age == 0.0


def test_capacity_and_staleness_are_applied() -> None:
    sim = CachedDFL(4, 1, [1, 1, 1, 1], capacity=1, tau_max=1, policy=UNIFORM)
    trained = torch.arange(4.0).reshape(4, 1)
    sim.round(trained, 0, [_pairs((0, 1), (0, 2), (0, 3))])
    assert len(sim.caches[0]) == 1  # C = 1 although three peers were met
    # Rounds pass without contacts: entries age and vanish after tau_max = 1.
    _, stats1 = sim.round(trained, 1, [])
    assert stats1.avg_age == 1.0 and len(sim.caches[0]) == 1
    blended, stats2 = sim.round(trained, 2, [])
    assert stats2.avg_models == 0.0 and np.isnan(stats2.avg_age)
    assert torch.equal(blended, trained)  # alone again: own model only
    assert len(sim.bank) == 0  # nothing references old models: the bank is empty


def test_fresher_version_replaces_older_one() -> None:
    sim = CachedDFL(2, 1, [1, 1], capacity=3, tau_max=5, policy=UNIFORM)
    sim.round(torch.tensor([[0.0], [10.0]]), 0, [_pairs((0, 1))])
    blended, _ = sim.round(torch.tensor([[0.0], [20.0]]), 1, [_pairs((0, 1))])
    assert [i.meta.version for i in sim.caches[0]] == [1]
    assert blended[0, 0].item() == pytest.approx(10.0)


def test_cached_dfl_is_deterministic_and_merges_lazily() -> None:
    rng = np.random.default_rng(0)
    ticks = [_pairs(*rng.integers(0, 6, size=(3, 2)).tolist()) for _ in range(20)]
    ticks = [t[t[:, 0] < t[:, 1]] for t in ticks]
    trained = torch.from_numpy(rng.normal(size=(6, 4))).float()
    # Contacts last several ticks: repeat each tick's pairs three times.
    ticks = [t for t in ticks for _ in range(3)]
    lazy = CachedDFL(6, 4, [1] * 6, capacity=2, tau_max=3, policy=UNIFORM)
    again = CachedDFL(6, 4, [1] * 6, capacity=2, tau_max=3, policy=UNIFORM)
    eager = CachedDFL(6, 4, [1] * 6, capacity=2, tau_max=3, policy=UNIFORM, lazy=False)
    for t in range(3):
        out_lazy, stats_lazy = lazy.round(trained + t, t, ticks)
        out_again, _ = again.round(trained + t, t, ticks)
        out_eager, stats_eager = eager.round(trained + t, t, ticks)
        assert torch.equal(out_lazy, out_again)
        # Skipping exchanges where neither cache changed is exact, and saves merges.
        assert torch.equal(out_lazy, out_eager) and stats_lazy == stats_eager
    assert lazy.merges < eager.merges / 2


def test_dfl_blends_only_with_agents_met() -> None:
    trained = torch.tensor([[0.0], [2.0], [4.0], [9.0]])
    met = np.zeros((4, 4), dtype=bool)
    met[0, 1] = met[1, 0] = met[1, 2] = met[2, 1] = True
    out = dfl_round(trained, met, [1, 1, 1, 1], UNIFORM)
    assert out[:, 0].tolist() == pytest.approx([1.0, 2.0, 3.0, 9.0])
    weighted = dfl_round(trained, met, [3, 1, 1, 1], AlphaPolicy.parse("examples"))
    assert weighted[0, 0].item() == pytest.approx(0.5)


def test_fedavg_gives_everyone_the_example_weighted_mean() -> None:
    trained = torch.tensor([[0.0, 1.0], [4.0, 1.0]])
    out = fedavg_round(trained, [3, 1])
    assert out.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_staleness_policy_down_weights_older_cached_models() -> None:
    # Round 0: 0 and 1 meet. Round 1: no contact, so 0 blends its fresh own model (age 0)
    # with 1's round-0 model (age 1): (1+s)^-1 gives raw weights 1 and 1/2.
    sim = CachedDFL(
        2, 1, [1, 1], capacity=2, tau_max=5, policy=AlphaPolicy.parse("staleness:poly:1")
    )
    sim.round(torch.tensor([[0.0], [3.0]]), 0, [_pairs((0, 1))])
    blended, stats = sim.round(torch.tensor([[6.0], [9.0]]), 1, [])
    assert stats.avg_age == 1.0
    assert blended[0, 0].item() == pytest.approx((6.0 * 1 + 3.0 * 0.5) / 1.5)
