"""Cached-DFL in the FedCache experiment: weight exchange over the mobility model.

The same partition, test splits and mini-batches as the knowledge runs; weights need one
architecture, so every client runs the large model. Its traffic is every model an exchange
actually moved (the daemon's Digest/Want fetches only what the merge keeps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from peerd.core.alpha import AlphaPolicy
from peerd.core.entry import CacheItem, flatten
from peerd.core.plan import BlendPlan
from peerd.core.round import Anchor, cached_dfl_round
from peerd.core.staleness import Clock
from peerd.learn.models import build_model
from peerd.sim.algorithms import CachedDFL, Contacts
from peerd.sim.knowledge_config import KnowledgeSimConfig
from peerd.sim.knowledge_data import Group, Setup, Tick, acc_at_targets, evaluate, metrics
from peerd.sim.maua import mean_of_client_best
from peerd.sim.runner import SimConfig, mobility_trace
from peerd.sim.train import draw_batches, matrix_to_stack, model_schema, train_batched


class _CountingCachedDFL(CachedDFL):
    """Cached-DFL that counts every model an exchange moved into a cache."""

    def __init__(self, *args: Any, model_bytes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model_bytes = model_bytes
        self.moved = 0

    def _receive(self, me: int, peer: int, t: int, clock: Clock) -> tuple[CacheItem, ...]:
        before = {(i.meta.origin, i.meta.version) for i in self.caches[me]}
        new = super()._receive(me, peer, t, clock)
        self.moved += sum((i.meta.origin, i.meta.version) not in before for i in new)
        return new


@dataclass
class _WeightOps:
    fleet: CachedDFL
    trainer: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        self.fleet.blend(plans)

    def train(self, anchors: Sequence[Anchor]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.trainer(self.fleet.matrix)


def run_cached_dfl(config: KnowledgeSimConfig, setup: Setup,
                    progress: Tick) -> dict[str, Any]:
    model = build_model("large", setup.input_shape, setup.num_classes, seed=config.seed)
    schema = model_schema(model)
    init = flatten(dict(model.named_parameters()), schema)
    fleet = _CountingCachedDFL(
        init.expand(config.agents, -1).clone(), [len(p) for p in setup.train],
        capacity=config.capacity, tau_max=config.tau_max, policy=AlphaPolicy.parse("uniform"),
        model_bytes=schema.flat_size * 4)
    mobility = SimConfig(agents=config.agents, round_seconds=config.round_seconds,
                         seed=config.seed)
    next_round = mobility_trace(mobility, np.random.default_rng(
        np.random.SeedSequence(config.seed).spawn(3)[2]))
    group = Group("large", list(range(config.agents)), setup, config.seed)
    evals: list[np.ndarray] = []
    curve: list[tuple[int, float, float, int]] = []
    for t in range(config.rounds):
        # vmap over the fleet's flat matrix needs one step count: the mean rule, always.
        batches = draw_batches(setup.train, setup.mean_steps, config.batch_size, config.seed, t)

        def trainer(m: torch.Tensor, b: list[torch.Tensor] = batches
                    ) -> tuple[torch.Tensor, torch.Tensor]:
            return train_batched(model, m, schema, setup.x, setup.y, b, lr=config.lr, rho=0.0)

        ops = _WeightOps(fleet, trainer)
        outcome = cached_dfl_round(fleet.agents(), clock=fleet.clock, policy=fleet.policy,
                                   rho=0.0, ops=ops)
        ticks = next_round()
        met = np.zeros((config.agents, config.agents), dtype=bool)
        for pairs in ticks:
            met[pairs[:, 0], pairs[:, 1]] = True
        fleet.publish(outcome.trained[0], t + 1, Contacts(ticks, met | met.T))
        if (t + 1) % config.eval_every == 0 or t + 1 == config.rounds:
            # The model each client just trained (blend + one local epoch on its own data):
            # the personalised model, as FedCache's clients are measured. (The blend that
            # opens the next round is a [K, bank] x [bank, D] product: too slow to preview.)
            group.stack = matrix_to_stack(fleet.matrix, schema)
            evals.append(evaluate([group], setup, config.agents))
            curve.append((t + 1, float(np.nanmean(evals[-1])), mean_of_client_best(evals),
                          fleet.moved * fleet.model_bytes))
        out = {"curve": curve, **metrics(evals), "acc_at": acc_at_targets(curve, config.targets),
               "local_epoch": "mean",
               "traffic": {"exchanged": fleet.moved * fleet.model_bytes,
                           "models_moved": fleet.moved},
               "parameters": {"large": schema.flat_size}, "rounds_done": t + 1}
        progress(t + 1, out)
    return out

