"""Aggregation of one round for each algorithm, all through :mod:`peerd.core`.

Every algorithm starts a round from the same place — each agent's trained model x̃_{i,t},
rows of an ``[A, D]`` matrix — and differs only in what it blends:

* ``cached-dfl``: at every contact both agents swap caches with the core's ``merge``
  (τ_max, C, freshest-first), then each agent blends its own model with its cache using the
  core's ``blend_plan`` (α policy) — all agents in one ``blend_rows`` product.
* ``dfl`` (DeFedAvg): blend with the models of the agents met during this round; no cache,
  no relay.
* ``fedavg``: one blend of all agents (example-weighted), given to everybody.
* ``isolated``: no blend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from peerd.core.alpha import AlphaPolicy, Member, alpha_weights
from peerd.core.blend import blend_rows
from peerd.core.cache import merge
from peerd.core.entry import CacheItem, EntryMeta
from peerd.core.plan import blend_plan
from peerd.core.staleness import Clock

ALGORITHMS = ("cached-dfl", "dfl", "fedavg", "isolated")


def origin_id(agent: int) -> str:
    return f"agent-{agent:04d}"


class ModelBank:
    """Trained models still referenced by some cache, as compact rows of one matrix.

    The simulator's stand-in for the daemon's payload store: cache items carry a key
    ``(origin, version)`` as payload and the bank maps it to a row. Rows are kept in the first
    ``len`` slots (removal moves the last row into the hole) so blending reads a view.
    """

    def __init__(self, dim: int) -> None:
        self._matrix = torch.empty(0, dim, dtype=torch.float32)
        self._keys: list[tuple[int, int]] = []
        self._row: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def occupied(self) -> torch.Tensor:
        return self._matrix[: len(self._keys)]

    def row(self, key: tuple[int, int]) -> int:
        return self._row[key]

    def add_many(self, keys: Sequence[tuple[int, int]], rows: torch.Tensor) -> None:
        need = len(self._keys) + len(keys)
        if need > self._matrix.shape[0]:
            # Grow geometrically: amortised O(1) copies, memory ~ live models only.
            grown = torch.empty(max(need, 2 * self._matrix.shape[0]), self._matrix.shape[1])
            grown[: len(self._keys)] = self.occupied
            self._matrix = grown
        start = len(self._keys)
        self._matrix[start:need] = rows
        for i, key in enumerate(keys):
            self._row[key] = start + i
        self._keys.extend(keys)

    def retain(self, live: set[tuple[int, int]]) -> None:
        for key in [k for k in self._keys if k not in live]:
            i = self._row.pop(key)
            last = len(self._keys) - 1
            if i != last:
                moved = self._keys[last]
                self._matrix[i] = self._matrix[last]
                self._keys[i] = moved
                self._row[moved] = i
            self._keys.pop()


@dataclass
class CacheStats:
    avg_models: float  # mean number of peer models in a cache, at blend time
    avg_age: float  # mean staleness (rounds) of those models; nan if all caches are empty


class CachedDFL:
    """Caches of all agents and the bank of the models they point to."""

    def __init__(
        self,
        num_agents: int,
        dim: int,
        num_examples: Sequence[int],
        *,
        capacity: int,
        tau_max: float,
        policy: AlphaPolicy,
        lazy: bool = True,
    ) -> None:
        self.n = num_agents
        self.lazy = lazy  # False: merge at every tick of every contact (the test reference)
        self.capacity = capacity
        self.tau_max = tau_max
        self.policy = policy
        self.num_examples = list(num_examples)
        self.caches: list[tuple[CacheItem, ...]] = [() for _ in range(num_agents)]
        self.bank = ModelBank(dim)
        self.own: list[CacheItem] = []
        self.merges = 0

    def _meta(self, agent: int, version: int) -> EntryMeta:
        origin = origin_id(agent)
        return EntryMeta(
            origin=origin,
            version=version,
            created_at=float(version),
            schema_id="sim",
            num_examples=self.num_examples[agent],
            # No equivocation exists in the simulator, so a unique stand-in avoids hashing
            # 100 x 2 MB per round; the core uses digests only to detect equivocation.
            digest=f"{origin}@{version}",
        )

    def round(
        self, trained: torch.Tensor, round_index: int, contact_ticks: Sequence[np.ndarray]
    ) -> tuple[torch.Tensor, CacheStats]:
        """Publish ``trained`` as version ``round_index``, exchange at contacts, blend."""
        t = round_index
        clock = Clock.rounds(t)
        self.bank.add_many([(a, t) for a in range(self.n)], trained)
        self.own = [
            CacheItem(self._meta(a, t), None, float(t), payload=(a, t)) for a in range(self.n)
        ]
        # A pair exchanges again only when one side's cache (or model) changed since their
        # last exchange: merge is a pure function, so the skipped call would change nothing.
        stamp = [0] * self.n
        last: dict[tuple[int, int], tuple[int, int]] = {}
        for pairs in contact_ticks:
            for i, j in pairs.tolist():
                if self.lazy and last.get((i, j)) == (stamp[i], stamp[j]):
                    continue
                new_i = self._receive(i, j, t, clock)
                new_j = self._receive(j, i, t, clock)  # both from the caches before the swap
                for a, new in ((i, new_i), (j, new_j)):
                    if _keys(new) != _keys(self.caches[a]):
                        stamp[a] += 1
                    self.caches[a] = new
                last[(i, j)] = (stamp[i], stamp[j])
        # Age out what expired since the last contact, then blend own + cache for everyone.
        alpha = np.zeros((self.n, len(self.bank)), dtype=np.float64)
        sizes: list[int] = []
        ages: list[float] = []
        for a in range(self.n):
            self.caches[a] = merge(
                self.caches[a],
                (),
                clock=clock,
                tau_max=self.tau_max,
                capacity=self.capacity,
                own_origin=origin_id(a),
            ).cache
            _, weights = blend_plan(self.own[a].meta, self.caches[a], clock, self.policy)
            members = [self.own[a], *self.caches[a]]
            for item, w in zip(members, weights, strict=True):
                alpha[a, self.bank.row(_key(item))] += w
            sizes.append(len(self.caches[a]))
            ages.extend(clock.staleness(item.meta) for item in self.caches[a])
        blended = blend_rows(self.bank.occupied, torch.from_numpy(alpha))
        live = {_key(item) for cache in self.caches for item in cache}
        self.bank.retain(live)
        stats = CacheStats(
            avg_models=float(np.mean(sizes)),
            avg_age=float(np.mean(ages)) if ages else float("nan"),
        )
        return blended, stats

    def _receive(self, me: int, peer: int, t: int, clock: Clock) -> tuple[CacheItem, ...]:
        sender = origin_id(peer)
        received = [
            CacheItem(item.meta, sender, float(t), payload=item.payload)
            for item in (self.own[peer], *self.caches[peer])
        ]
        self.merges += 1
        return merge(
            self.caches[me],
            received,
            clock=clock,
            tau_max=self.tau_max,
            capacity=self.capacity,
            own_origin=origin_id(me),
        ).cache


def _key(item: CacheItem) -> tuple[int, int]:
    key = item.payload
    assert isinstance(key, tuple)
    return key


def _keys(cache: Sequence[CacheItem]) -> list[tuple[str, int]]:
    return [(item.meta.origin, item.meta.version) for item in cache]


def dfl_round(
    trained: torch.Tensor,
    met: np.ndarray,
    num_examples: Sequence[int],
    policy: AlphaPolicy,
) -> torch.Tensor:
    """DeFedAvg: each agent blends itself with everyone it met this round (``met`` [A, A])."""
    n = trained.shape[0]
    alpha = np.zeros((n, n), dtype=np.float64)
    for a in range(n):
        members = [a, *np.flatnonzero(met[a]).tolist()]
        weights = alpha_weights(policy, [Member(num_examples[m], 0.0) for m in members])
        alpha[a, members] = weights
    return blend_rows(trained, torch.from_numpy(alpha))


def fedavg_round(trained: torch.Tensor, num_examples: Sequence[int]) -> torch.Tensor:
    """FedAvg: the example-weighted mean of all agents, handed to every agent."""
    weights = alpha_weights(AlphaPolicy.parse("examples"), [Member(n, 0.0) for n in num_examples])
    global_model = blend_rows(trained, torch.from_numpy(weights))
    return global_model.expand(trained.shape[0], -1).clone()
