"""What each simulated algorithm blends, as the blend step of the core round for all agents.

Every algorithm runs the daemon's round (:func:`peerd.core.round.cached_dfl_round`: plan →
α → blend → local update → publish) for all agents at once, and they differ only in what an
agent holds when it blends (its "cache"):

* ``cached-dfl``: its cache: at every contact both agents swap their own model and cache with
  the core's ``merge`` (τ_max, C, freshest first), so models also travel by relay;
* ``dfl`` (DeFedAvg): the models of the agents it met during the last round; no cache, no relay;
* ``fedavg``: every agent's model, weighted by example count: one global model for everybody;
* ``isolated``: nothing.

A :class:`Fleet` holds one algorithm's agents: their models as rows of an ``[A, D]`` float32
matrix, and what each holds to blend. Its ``blend`` is one ``blend_rows`` product for all
agents; training is the runner's (the same for every algorithm). A robust rule (``--blend``,
:mod:`peerd.core.robust`) runs per agent over its rows (``blend_robust``): median and
Krum are not one product for all agents. What the fleet must not do:
decide α, order the round or draw random numbers (plans come from the core round).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from peerd.core.alpha import AlphaPolicy
from peerd.core.blend import blend_rows
from peerd.core.blendrules import RobustError, RobustRule
from peerd.core.cache import merge
from peerd.core.entry import CacheItem, EntryMeta
from peerd.core.plan import BlendPlan
from peerd.core.robust import robust_blend_rows
from peerd.core.round import RoundAgent
from peerd.core.staleness import Clock
from peerd.sim.wirecodec import WireCodec

ALGORITHMS = ("cached-dfl", "dfl", "fedavg", "isolated")


def origin_id(agent: int) -> str:
    return f"agent-{agent:04d}"


def agent_meta(agent: int, version: int, num_examples: int) -> EntryMeta:
    """Agent ``agent``'s model of round ``version`` as an entry would describe it."""
    origin = origin_id(agent)
    return EntryMeta(
        origin=origin,
        version=version,
        created_at=float(version),
        schema_id="sim",
        num_examples=num_examples,
        # No equivocation exists in the simulator, so a unique stand-in avoids hashing
        # 100 x 2 MB per round; the core uses digests only to detect equivocation.
        digest=f"{origin}@{version}",
    )


@dataclass(frozen=True, slots=True)
class Contacts:
    """Who met whom during one round."""

    ticks: Sequence[np.ndarray]  # per 1 s tick, the [n, 2] pairs (i < j) in range
    met: np.ndarray  # [A, A] bool, symmetric: met at some tick of the round


@dataclass
class CacheStats:
    avg_models: float  # mean number of peer models in a cache, at blend time
    avg_age: float  # mean staleness (rounds) of those models; nan if all caches are empty


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


class Fleet:
    """All agents of one algorithm. This base class is ``isolated``: nobody blends anything.

    ``matrix`` is every agent's current model: its trained model once published, then the
    blend that opens the next round. ``version`` is the round last published (None: none yet,
    every agent still holds the initial model).
    """

    def __init__(self, init: torch.Tensor, num_examples: Sequence[int], policy: AlphaPolicy):
        self.matrix = init
        self.n = init.shape[0]
        self.num_examples = list(num_examples)
        self.policy = policy
        self.version: int | None = None

    @property
    def clock(self) -> Clock:
        """Now, for the blend that opens the next round: the round last published."""
        return Clock.rounds(self.version or 0)

    def agents(self) -> list[RoundAgent]:
        """Each agent's own model and what it holds to blend, in the core round's terms."""
        version = self.version or 0
        return [
            RoundAgent(agent_meta(a, version, self.num_examples[a]), self.held(a),
                       published=self.version is not None)
            for a in range(self.n)
        ]

    def held(self, agent: int) -> tuple[CacheItem, ...]:
        """The peer models ``agent`` blends with (cache order)."""
        return ()

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        """Nothing to blend: every plan is alone."""

    def blend_robust(self, plans: Sequence[BlendPlan], rule: RobustRule) -> None:
        """``rule`` over each agent's own row and held rows of ``matrix`` (none here)."""
        if self.version is None:
            return
        self.matrix = _robust(self.matrix, self.matrix, [
            [a, *(_payload(item) for item in self.held(a))] for a in range(self.n)], plans, rule)

    def publish(self, trained: torch.Tensor, t: int, contacts: Contacts) -> None:
        """Round ``t``'s trained models become version ``t``; then the round's contacts."""
        self.matrix = trained
        self.version = t

    def stats(self) -> CacheStats | None:
        return None

    def _peers_of(self, t: int, agents: Iterable[int]) -> tuple[CacheItem, ...]:
        """Version ``t`` of ``agents``' models as cache items keyed by their row."""
        return tuple(
            CacheItem(agent_meta(m, t, self.num_examples[m]), None, float(t), payload=m)
            for m in agents
        )

    def _alpha(self, plans: Sequence[BlendPlan]) -> np.ndarray:
        """``[A, A]``: each agent's plan spread over the rows of ``matrix`` (own + held)."""
        alpha = np.zeros((self.n, self.n), dtype=np.float64)
        for a, plan in enumerate(plans):
            rows = [a, *(_payload(item) for item in self.held(a))]
            alpha[a, rows] = plan.alpha
        return alpha


class DFL(Fleet):
    """DeFedAvg: blend with the agents met during the last round, as they were published."""

    def __init__(self, init: torch.Tensor, num_examples: Sequence[int], policy: AlphaPolicy):
        super().__init__(init, num_examples, policy)
        self.met = np.zeros((self.n, self.n), dtype=bool)

    def held(self, agent: int) -> tuple[CacheItem, ...]:
        if self.version is None:
            return ()
        return self._peers_of(self.version, np.flatnonzero(self.met[agent]).tolist())

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        if self.version is None:
            return
        self.matrix = blend_rows(self.matrix, torch.from_numpy(self._alpha(plans)))

    def publish(self, trained: torch.Tensor, t: int, contacts: Contacts) -> None:
        super().publish(trained, t, contacts)
        self.met = contacts.met


class FedAvg(Fleet):
    """FedAvg: every agent blends every agent's model by example count (the policy given)."""

    def __init__(self, init: torch.Tensor, num_examples: Sequence[int], policy: AlphaPolicy):
        super().__init__(init, num_examples, policy)
        self._everyone: tuple[CacheItem, ...] = ()

    def held(self, agent: int) -> tuple[CacheItem, ...]:
        return self._everyone[:agent] + self._everyone[agent + 1 :]

    def publish(self, trained: torch.Tensor, t: int, contacts: Contacts) -> None:
        super().publish(trained, t, contacts)
        self._everyone = self._peers_of(t, range(self.n))

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        if self.version is None:
            return
        # Every agent blends the same models with the same weights (its own first, which for
        # agent 0 is row order): one product gives the global model, handed to everybody.
        weights = torch.tensor(plans[0].alpha, dtype=torch.float64)
        self.matrix = blend_rows(self.matrix, weights).expand(self.n, -1).clone()


class CachedDFL(Fleet):
    """Caches of all agents and the bank of the models they point to."""

    def __init__(
        self,
        init: torch.Tensor,
        num_examples: Sequence[int],
        *,
        capacity: int,
        tau_max: float,
        policy: AlphaPolicy,
        lazy: bool = True,
        wire: WireCodec | None = None,
    ) -> None:
        super().__init__(init, num_examples, policy)
        self.lazy = lazy  # False: merge at every tick of every contact (the test reference)
        #: A compact encoding's round trip (peerd.sim.wirecodec): peers blend the decoded
        #: models, each agent its own float32 one. None: entries are float32, bit for bit.
        self.wire = wire
        self._own_rows: torch.Tensor | None = None
        #: Entries an exchange moved into a cache (what a daemon's Want fetches), and their
        #: payload bytes, per round published (index t - 1).
        self.transfers: list[int] = []
        self.transfer_bytes: list[int] = []
        self._payload_len: dict[tuple[int, int], int] = {}
        self.capacity = capacity
        self.tau_max = tau_max
        self.caches: list[tuple[CacheItem, ...]] = [() for _ in range(self.n)]
        self.bank = ModelBank(init.shape[1])
        self.own: list[CacheItem] = []
        self.merges = 0
        self._stats: CacheStats | None = None

    def agents(self) -> list[RoundAgent]:
        if not self.own:
            return super().agents()
        return [RoundAgent(self.own[a].meta, self.caches[a], published=True) for a in range(self.n)]

    def held(self, agent: int) -> tuple[CacheItem, ...]:
        return self.caches[agent]

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        if not self.own:
            return  # nothing published yet: every agent holds the initial model, alone
        clock = self.clock
        source, own_row = self._source()
        alpha = np.zeros((self.n, source.shape[0]), dtype=np.float64)
        sizes: list[int] = []
        ages: list[float] = []
        for a, plan in enumerate(plans):
            alpha[a, own_row(a)] += plan.alpha[0]
            for item, w in zip(self.caches[a], plan.alpha[1:], strict=True):
                alpha[a, self.bank.row(_key(item))] += w
            sizes.append(len(self.caches[a]))
            ages.extend(clock.staleness(item.meta) for item in self.caches[a])
        self.matrix = blend_rows(source, torch.from_numpy(alpha))
        self._after_blend(sizes, ages)

    def _source(self) -> tuple[torch.Tensor, Callable[[int], int]]:
        """The rows a blend reads, and where agent a's own model is among them: its entry's
        bank row, or with a lossy encoding its float32 model after the bank's rows."""
        if self.wire is None or self._own_rows is None:
            return self.bank.occupied, lambda a: self.bank.row(_key(self.own[a]))
        base = len(self.bank)
        return torch.cat([self.bank.occupied, self._own_rows]), lambda a: base + a

    def blend_robust(self, plans: Sequence[BlendPlan], rule: RobustRule) -> None:
        if not self.own:
            return
        clock = self.clock
        source, own_row = self._source()
        rows = [[own_row(a), *(self.bank.row(_key(item)) for item in self.caches[a])]
                for a in range(self.n)]
        self.matrix = _robust(source, self.matrix, rows, plans, rule)
        self._after_blend([len(c) for c in self.caches],
                          [clock.staleness(item.meta) for c in self.caches for item in c])

    def _after_blend(self, sizes: list[int], ages: list[float]) -> None:
        live = {_key(item) for cache in self.caches for item in cache}
        self.bank.retain(live)
        self._payload_len = {k: v for k, v in self._payload_len.items() if k in live}
        self._stats = CacheStats(
            avg_models=float(np.mean(sizes)),
            avg_age=float(np.mean(ages)) if ages else float("nan"),
        )

    def stats(self) -> CacheStats | None:
        return self._stats

    def payload_sizes(self) -> list[int]:
        """The distinct payload lengths of the entries still held (bytes)."""
        return sorted(set(self._payload_len.values()))

    def publish(self, trained: torch.Tensor, t: int, contacts: Contacts) -> None:
        """Version ``t`` into the bank, exchanges at every contact, then age the caches out."""
        super().publish(trained, t, contacts)
        clock = self.clock
        keys = [(a, t) for a in range(self.n)]
        if self.wire is None:
            self.bank.add_many(keys, trained)
            sizes = [4 * trained.shape[1]] * self.n  # float32, the simulator's only dtype
        else:
            received, sizes = self.wire.roundtrip(trained)
            self.bank.add_many(keys, received)
            self._own_rows = trained
        self._payload_len.update(zip(keys, sizes, strict=True))
        self.transfers.append(0)
        self.transfer_bytes.append(0)
        self.own = [
            CacheItem(agent_meta(a, t, self.num_examples[a]), None, float(t), payload=(a, t))
            for a in range(self.n)
        ]
        # A pair exchanges again only when one side's cache (or model) changed since their
        # last exchange: merge is a pure function, so the skipped call would change nothing.
        stamp = [0] * self.n
        last: dict[tuple[int, int], tuple[int, int]] = {}
        for pairs in contacts.ticks:
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
        self.caches = [
            merge(cache, (), clock=clock, tau_max=self.tau_max, capacity=self.capacity,
                  own_origin=origin_id(a)).cache
            for a, cache in enumerate(self.caches)
        ]

    def _receive(self, me: int, peer: int, t: int, clock: Clock) -> tuple[CacheItem, ...]:
        sender = origin_id(peer)
        received = [
            CacheItem(item.meta, sender, float(t), payload=item.payload)
            for item in (self.own[peer], *self.caches[peer])
        ]
        self.merges += 1
        held = {_key(item) for item in self.caches[me]}
        new = merge(
            self.caches[me],
            received,
            clock=clock,
            tau_max=self.tau_max,
            capacity=self.capacity,
            own_origin=origin_id(me),
        ).cache
        # What crossed the link: the entries the merge took in (a Want asks for no other).
        moved = [_key(item) for item in new if _key(item) not in held]
        self.transfers[-1] += len(moved)
        self.transfer_bytes[-1] += sum(self._payload_len[k] for k in moved)
        return new


def make_fleet(
    algorithm: str,
    init: torch.Tensor,
    num_examples: Sequence[int],
    *,
    policy: AlphaPolicy,
    capacity: int,
    tau_max: float,
    wire: WireCodec | None = None,
) -> Fleet:
    """The fleet of ``algorithm``, every agent starting from its row of ``init``; ``wire``:
    cached-DFL's entries through a compact encoding (the other algorithms exchange none)."""
    if algorithm == "cached-dfl":
        return CachedDFL(init, num_examples, capacity=capacity, tau_max=tau_max, policy=policy,
                         wire=wire)
    if algorithm == "dfl":
        return DFL(init, num_examples, policy)
    if algorithm == "fedavg":
        return FedAvg(init, num_examples, AlphaPolicy.parse("examples"))
    if algorithm == "isolated":
        return Fleet(init, num_examples, policy)
    raise ValueError(f"unknown algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")


def _robust(source: torch.Tensor, own: torch.Tensor, rows: Sequence[Sequence[int]],
            plans: Sequence[BlendPlan], rule: RobustRule) -> torch.Tensor:
    """Agent a's model: ``rule`` over ``source[rows[a]]`` (own row first) with its plan's α;
    an alone plan, or Krum with too few models (as in the daemon), keeps ``own[a]``."""
    out = own.clone()
    for a, (r, plan) in enumerate(zip(rows, plans, strict=True)):
        if plan.alone:
            continue
        # Krum with too few models: the daemon's choice too, blend nothing rather than lower f.
        with contextlib.suppress(RobustError):
            out[a] = robust_blend_rows(source[list(r)], plan.alpha, rule)
    return out


def _payload(item: CacheItem) -> int:
    row = item.payload
    assert isinstance(row, int)
    return row


def _key(item: CacheItem) -> tuple[int, int]:
    key = item.payload
    assert isinstance(key, tuple)
    return key


def _keys(cache: Sequence[CacheItem]) -> list[tuple[str, int]]:
    return [(item.meta.origin, item.meta.version) for item in cache]
