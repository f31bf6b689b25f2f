"""FedCache's knowledge fleet: every client distils one epoch against teachers from a cache.

One round skeleton (:func:`run_fedcache`), two ways knowledge travels:

* :class:`AllToAll` (``fedcache``, and ``isolated`` with β = 0): one cache holding every
  client's latest logits, what the paper's server gives. Traffic is counted both ways:
  server-equivalent (the paper's) and gossip all-to-all (peerd without a server).
* :class:`OverContacts` (``fedcache-mobility``): each client holds only the knowledge entries
  it was handed at the mobility model's contacts, merged by the lecture's cache rule (keep
  the latest version per origin, drop what is older than τ_max, keep the C most recent:
  :func:`peerd.core.cache.merge`, through the simulator's Cached-DFL caches), relayed as
  model entries are; what the daemon's knowledge mode does on a LAN. Traffic is what the
  exchanges moved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from peerd.core.alpha import AlphaPolicy
from peerd.core.distill import Distillation, batched_distill_update
from peerd.core.entry import CacheItem
from peerd.core.plan import BlendPlan
from peerd.core.round import Anchor, BlendPolicy, RoundAgent, cached_dfl_round
from peerd.core.staleness import Clock
from peerd.learn.keys import SampleEncoder
from peerd.learn.knowcache import KnowledgeBatch, KnowledgeCache
from peerd.sim.algorithms import CachedDFL, Contacts, agent_meta, origin_id
from peerd.sim.knowledge_config import F16, KnowledgeSimConfig
from peerd.sim.knowledge_data import (
    Group,
    Setup,
    Tick,
    acc_at_targets,
    evaluate,
    make_groups,
    metrics,
)
from peerd.sim.maua import mean_of_client_best
from peerd.sim.runner import SimConfig, mobility_trace
from peerd.sim.train import draw_batches


@dataclass
class _KnowledgeOps:
    """The core round's ops for knowledge mode: nothing to blend; distil one epoch."""

    groups: list[Group]
    setup: Setup
    batches: list[torch.Tensor]
    teacher: torch.Tensor  # [N_train, C]: each training sample's teacher logits
    has: torch.Tensor  # [N_train] bool
    lr: float

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        raise AssertionError("knowledge mode blends nothing")

    def train(self, anchors: Sequence[Anchor]) -> torch.Tensor:
        raise AssertionError("knowledge mode trains through distill")

    def distill(self, anchors: Sequence[Anchor], policy: Distillation) -> torch.Tensor:
        losses = torch.zeros(sum(len(g.members) for g in self.groups))
        for g in self.groups:
            sizes = np.array([self.batches[a].shape[1] for a in g.members])
            for size in np.unique(sizes):
                local = np.flatnonzero(sizes == size)
                sel = torch.from_numpy(local)
                own = [self.batches[g.members[i]] for i in local]
                counts = torch.tensor([b.shape[0] for b in own])
                longest = int(counts.max())
                # Pad to the longest epoch with its first rows: padding is never trained on.
                idx = torch.stack([b if b.shape[0] == longest else
                                   torch.cat([b, b[:1].expand(longest - b.shape[0], -1)])
                                   for b in own], dim=1)  # [K, g, b]
                stack = {n: t[sel] for n, t in g.stack.items()}
                new, loss = batched_distill_update(
                    g.model, stack, self.setup.x[idx], self.setup.y[idx], self.teacher[idx],
                    self.has[idx], lr=self.lr, policy=policy,
                    steps_per_agent=None if bool((counts == longest).all()) else counts)
                for n in g.stack:
                    g.stack[n][sel] = new[n]
                losses[torch.tensor([g.members[i] for i in local])] = loss
        return losses


@dataclass
class KnowledgeFleet:
    """What every client's knowledge is made of: keys and labels, fixed for a run."""

    config: KnowledgeSimConfig
    setup: Setup
    keys: list[np.ndarray]
    labels: list[np.ndarray]

    @classmethod
    def build(cls, config: KnowledgeSimConfig, setup: Setup) -> KnowledgeFleet:
        """Every client's keys from the run's seeded encoder, and its labels."""
        encoder = SampleEncoder(b"peerd-sim", setup.input_shape, config.key_dim)
        parts = [torch.from_numpy(p) for p in setup.train]
        return cls(config, setup, [encoder.encode(setup.x[p].numpy()) for p in parts],
                   [setup.y[p].numpy() for p in parts])

    @property
    def samples(self) -> int:
        return sum(len(p) for p in self.setup.train)

    def key_bytes(self, agent: int) -> int:
        """Agent's keys on the wire: float16 key, a label byte and an index per sample."""
        n = len(self.setup.train[agent])
        return n * (self.config.key_dim * F16 + 1 + self.config.index_bytes)

    def logit_bytes(self, agent: int) -> int:
        """Agent's logits on the wire: float16 logits and an index per sample."""
        n = len(self.setup.train[agent])
        return n * (self.setup.num_classes * F16 + self.config.index_bytes)


class Exchange(Protocol):
    """How knowledge travels between rounds, and what that costs."""

    def teachers(self, t: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Round ``t``'s teacher logits ``[N_train, C]`` and which rows have one, or None."""

    def publish(self, t: int, logits: list[tuple[int, np.ndarray]]) -> None:
        """Every client's float16 logits after round ``t``, as (client, logits)."""

    def curve_bytes(self) -> int:
        """The traffic the curve's last column carries, so far."""

    def traffic(self) -> dict[str, int]:
        """The run's traffic so far, by kind."""


class AllToAll:
    """One cache of every client's latest knowledge: the paper's server, or gossip to all.

    Server-equivalent (the paper's count): every key once up with its label and index, then
    per round every sample's logits and index up and its teacher down (round 1 too when
    eq. 9's zeros are the teachers). Gossip all-to-all (peerd without a server): every
    origin's batch to each of the K - 1 others, keys once (a row is its id), logits with
    their ids every round (the knowledge entry's int32 ids)."""

    def __init__(self, fleet: KnowledgeFleet, distilling: bool) -> None:
        self.fleet = fleet
        c = fleet.config
        self.cache = KnowledgeCache(c.key_dim, fleet.setup.num_classes)
        self.distilling = distilling
        self.zero_first = distilling and c.round1_knowledge == "zero"
        samples = fleet.samples
        keys = samples * (c.key_dim * F16 + 1)  # + a label byte per sample
        self.down = samples * fleet.setup.num_classes * F16
        self.up = self.down + samples * c.index_bytes
        self.server = self.gossip = 0
        if distilling:
            self.server += keys + samples * c.index_bytes
            self.gossip += keys * (c.agents - 1)

    def teachers(self, t: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        setup = self.fleet.setup
        if self.distilling and len(self.cache):
            teacher = torch.zeros(setup.x.shape[0], setup.num_classes)
            has = torch.zeros(setup.x.shape[0], dtype=torch.bool)
            for a, part in enumerate(setup.train):
                z, count = self.cache.teacher_logits(self.fleet.keys[a], self.fleet.labels[a],
                                                     r=self.fleet.config.r,
                                                     exclude=origin_id(a))
                idx = torch.from_numpy(part)
                teacher[idx] = torch.from_numpy(z)
                has[idx] = torch.from_numpy(count > 0)
            self.server += self.down  # the teachers, down
            return teacher, has
        if self.zero_first and t == 0:
            self.server += self.down  # the zeros, down (the server answers every upload)
            return _zeros(setup)
        return None

    def publish(self, t: int, logits: list[tuple[int, np.ndarray]]) -> None:
        if not self.distilling:
            return
        for a, z16 in logits:
            self.cache.put(KnowledgeBatch(origin_id(a), t + 1, float(t + 1), self.fleet.keys[a],
                                          self.fleet.labels[a], z16.astype(np.float32)))
        self.server += self.up
        self.gossip += self.up * (self.fleet.config.agents - 1)

    def curve_bytes(self) -> int:
        return self.server

    def traffic(self) -> dict[str, int]:
        return {"server_equivalent": self.server, "gossip_all_to_all": self.gossip}

    def info(self) -> dict[str, Any]:
        return {"index_rebuilds": self.cache.rebuilds}


def _zeros(setup: Setup) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 9: every sample's knowledge starts as C zeros (τ(0) is uniform)."""
    n = setup.x.shape[0]
    return torch.zeros(n, setup.num_classes), torch.ones(n, dtype=torch.bool)


class _MovesCachedDFL(CachedDFL):
    """The simulator's Cached-DFL caches, for metadata only, recording each entry a merge
    took in as (receiver, (origin agent, version))."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.moves: list[tuple[int, tuple[int, int]]] = []

    def _receive(self, me: int, peer: int, t: int, clock: Clock) -> tuple[CacheItem, ...]:
        before = {_entry(item) for item in self.caches[me]}
        new = super()._receive(me, peer, t, clock)
        self.moves += [(me, _entry(item)) for item in new if _entry(item) not in before]
        return new


def _entry(item: CacheItem) -> tuple[int, int]:
    """The (origin agent, version) a simulated cache entry stands for (its payload)."""
    key = item.payload
    if not isinstance(key, tuple):
        raise TypeError(f"not a simulated entry: payload {key!r}")
    return int(key[0]), int(key[1])


class OverContacts:
    """Each client's own knowledge cache, filled only by the mobility model's contacts.

    The entries are the Cached-DFL caches' (capacity C, τ_max in rounds, the latest version
    per origin, relayed): a client's teachers are the R nearest same-label samples among
    the origins it holds. A client that holds nothing trains CE only (after round 1's eq. 9
    zeros). Traffic: every entry a merge took in moved its logits with their indices, and
    an origin's keys crossed once per receiver, the first time it took that origin in."""

    def __init__(self, fleet: KnowledgeFleet) -> None:
        self.fleet = fleet
        c = fleet.config
        k = c.agents
        self.caches = _MovesCachedDFL(torch.zeros(k, 1), [len(p) for p in fleet.setup.train],
                                      capacity=c.capacity, tau_max=c.tau_max,
                                      policy=AlphaPolicy.parse("uniform"))
        self.next_round = mobility_trace(
            SimConfig(agents=k, round_seconds=c.round_seconds, seed=c.seed),
            np.random.default_rng(np.random.SeedSequence(c.seed).spawn(3)[2]))
        self.local = [KnowledgeCache(c.key_dim, fleet.setup.num_classes) for _ in range(k)]
        self.logits: dict[tuple[int, int], np.ndarray] = {}  # (agent, version) -> float32
        self.has_keys: set[tuple[int, int]] = set()  # (receiver, origin agent)
        self.moved = self.entries = 0
        self.held: list[int] = []

    def teachers(self, t: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        setup = self.fleet.setup
        if t == 0:
            return _zeros(setup) if self.fleet.config.round1_knowledge == "zero" else None
        teacher = torch.zeros(setup.x.shape[0], setup.num_classes)
        has = torch.zeros(setup.x.shape[0], dtype=torch.bool)
        for a, part in enumerate(setup.train):
            if not len(self.local[a]):
                continue
            # Its own origin is never held (the merge drops it), excluded all the same.
            z, count = self.local[a].teacher_logits(self.fleet.keys[a], self.fleet.labels[a],
                                                    r=self.fleet.config.r,
                                                    exclude=origin_id(a))
            idx = torch.from_numpy(part)
            teacher[idx] = torch.from_numpy(z)
            has[idx] = torch.from_numpy(count > 0)
        return teacher, has

    def publish(self, t: int, logits: list[tuple[int, np.ndarray]]) -> None:
        version = t + 1
        for a, z16 in logits:
            self.logits[(a, version)] = z16.astype(np.float32)
        ticks = self.next_round()
        k = self.fleet.config.agents
        met = np.zeros((k, k), dtype=bool)
        for pairs in ticks:
            met[pairs[:, 0], pairs[:, 1]] = True
        self.caches.moves.clear()
        self.caches.publish(self.caches.matrix, version, Contacts(ticks, met | met.T))
        for me, (origin, _) in self.caches.moves:
            self.moved += self.fleet.logit_bytes(origin)
            if (me, origin) not in self.has_keys:
                self.has_keys.add((me, origin))
                self.moved += self.fleet.key_bytes(origin)
        self.entries += len(self.caches.moves)
        live: set[tuple[int, int]] = set()
        self.held = []
        for a, cache in enumerate(self.caches.caches):
            mine = {_entry(item) for item in cache}
            live.update(mine)
            self.held.append(len(mine))
            held = self.local[a]
            wanted = {origin_id(o): (o, v) for o, v in mine}
            for name in set(held.origins()) - set(wanted):
                held.drop(name)
            for name, (o, v) in wanted.items():
                if held.version_of(name) != v:
                    held.put(KnowledgeBatch(name, v, float(v), self.fleet.keys[o],
                                            self.fleet.labels[o], self.logits[(o, v)]))
        self.logits = {key: z for key, z in self.logits.items() if key in live}

    def curve_bytes(self) -> int:
        return self.moved

    def traffic(self) -> dict[str, int]:
        return {"exchanged": self.moved, "entries_moved": self.entries}

    def info(self) -> dict[str, Any]:
        held = self.held or [0]
        return {"knowledge_entries_held_mean": float(np.mean(held)),
                "index_rebuilds": sum(c.rebuilds for c in self.local)}


def run_fedcache(config: KnowledgeSimConfig, setup: Setup, alg: str,
                 progress: Tick) -> dict[str, Any]:
    """``fedcache`` / ``isolated`` (all-to-all) or ``fedcache-mobility`` for the run."""
    groups = make_groups(config, setup)
    beta = 0.0 if alg == "isolated" else config.beta
    policy = Distillation(beta, config.t, config.r, config.distill_form)
    fleet = KnowledgeFleet.build(config, setup)
    exchange: AllToAll | OverContacts = (OverContacts(fleet) if alg == "fedcache-mobility"
                                         else AllToAll(fleet, beta > 0))
    evals: list[np.ndarray] = []
    curve: list[tuple[int, float, float, int]] = []
    agents = [RoundAgent(agent_meta(a, 0, len(p)), ()) for a, p in enumerate(setup.train)]
    out: dict[str, Any] = {}
    n = setup.x.shape[0]
    for t in range(config.rounds):
        teacher, has = exchange.teachers(t) or (torch.zeros(n, setup.num_classes),
                                                torch.zeros(n, dtype=torch.bool))
        batches = draw_batches(setup.train, setup.steps, config.batch_size, config.seed, t)
        ops = _KnowledgeOps(groups, setup, batches, teacher, has, config.lr)
        cached_dfl_round(agents, clock=Clock.rounds(t), policy=AlphaPolicy.parse("uniform"),
                         rho=0.0, ops=ops, blend=BlendPolicy.NONE, local=policy)
        if beta > 0:
            exchange.publish(t, _published_logits(groups, setup))
        if (t + 1) % config.eval_every == 0 or t + 1 == config.rounds:
            evals.append(evaluate(groups, setup, config.agents))
            curve.append((t + 1, float(np.nanmean(evals[-1])),
                          mean_of_client_best(evals), exchange.curve_bytes()))
        out = {"curve": curve, **metrics(evals), "acc_at": acc_at_targets(curve, config.targets),
               "traffic": exchange.traffic(),
               "parameters": {g.kind: g.params_count for g in groups},
               **exchange.info(), "rounds_done": t + 1}
        progress(t + 1, out)
    return out


def _published_logits(groups: Sequence[Group], setup: Setup) -> list[tuple[int, np.ndarray]]:
    """(client, its logits on its own training samples in float16: what a peer receives),
    group by group (the order the cache learns origins in)."""
    out = []
    for g in groups:
        for i, a in enumerate(g.members):
            rows = torch.from_numpy(setup.train[a])
            out.append((a, g.logits(i, setup.x[rows]).numpy().astype(np.float16)))
    return out
