"""FedCache in the simulator: knowledge exchange beside Cached-DFL weight exchange.

The FedCache experiment (seed ``fedcache-notes-zh.txt`` §5): K clients, a Dirichlet(α) split
of the training set and a test split with the same label mix per client, one local epoch per
round (SGD, lr 0.01, batch 8), β = 1.5, R = 16; MAUA = the maximum over evaluated rounds of
the clients' mean accuracy, each on its own test split (:mod:`peerd.sim.maua`, beside the mean
of each client's own best, which is not MAUA); the traffic every method moved.

* ``fedcache``: every round of every client is the core round with blend policy ``none`` and
  local policy :class:`peerd.core.distill.Distillation`; teachers come from a
  :class:`peerd.learn.knowcache.KnowledgeCache` holding every other client's latest
  knowledge (all-to-all contact: what FedCache's server gives, without one). Models may
  differ: ``--model mixed`` assigns small / medium / large by client index mod 3.
* ``isolated``: the same clients and models, local cross-entropy only (β = 0 distillation).
* ``cached-dfl``: weight exchange on the same partition and test splits, over the mobility
  model (:mod:`peerd.sim.mobility`); weights need one architecture, so every client runs the
  large model. Its traffic is every model an exchange actually moved (the daemon's
  Digest/Want fetches only what the merge keeps).

All methods draw the same mini-batches (:func:`peerd.sim.train.draw_batches`).

**The paper's forms and the old ones** (each a config key and a ``peerd sim`` flag; a run's
JSON names all four, and a JSON without them was measured with the old forms,
:data:`peerd.sim.fedcache_forms.OLD_FORMS`):

* ``distill_form``: ``eq18`` (default) or ``code``, :attr:`peerd.core.distill.Distillation.form`.
* ``local_epoch``: ``client`` (default): one local epoch is ``ceil(n_k / B)`` steps for client
  k, each its own count (the last batch tops up from the next shuffle, so it is full);
  ``mean``: ``ceil(mean n_k / B)`` steps for every client (the old rule; with α = 1 and
  K = 300 that is 0.46–3.03 of a client's epoch). Cached-DFL's batched trainer needs one step
  count, so ``cached-dfl`` runs always use ``mean`` (its JSON says so).
* ``round1_knowledge``: ``zero`` (default): eq. 9 initialises every sample's knowledge to C
  zeros, so at round 1 every sample has a teacher and τ(0) is uniform; ``none``: round 1
  trains CE only (the old behaviour: the cache is empty).
* ``index_bytes``: the width of the sample index uploaded with each row of logits (and with
  each key at initialisation), §4.1: "私有样本的logits及其索引被上传". 4 (default) is an int32
  per row, what a K = 300 x 200-sample fleet needs and what an encoder would send; 0 is the
  old count (float16 logits only). Downlinked teachers carry no index: the server answers the
  upload in its order. Gossip all-to-all counts it too on every knowledge batch (peerd's
  knowledge entries carry int32 ``ids``, ``protocol/knowledge.py``) but not on keys (a keys
  entry's row is its id).

Traffic to a target accuracy (the paper's acc@, Table 5's caption): for each target in
``targets`` the first evaluated round whose mean client accuracy reaches it and the
server-equivalent bytes moved by then (``acc_at`` in the JSON; ``null`` when never reached),
beside the total to the last round.
Owns this experiment's loop, metrics and traffic accounting; it decides nothing of a round
(the core round does) and never touches the network.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.func import functional_call

from peerd.core.alpha import AlphaPolicy
from peerd.core.distill import DISTILL_FORMS, Distillation, DistillForm, batched_distill_update
from peerd.core.entry import CacheItem, flatten
from peerd.core.plan import BlendPlan
from peerd.core.round import Anchor, BlendPolicy, RoundAgent, cached_dfl_round
from peerd.core.staleness import Clock
from peerd.learn.data import DataError, check_partition_spec, load_dataset, partition
from peerd.learn.keys import SampleEncoder
from peerd.learn.knowcache import KnowledgeBatch, KnowledgeCache
from peerd.learn.models import build_model, count_parameters
from peerd.sim.algorithms import CachedDFL, Contacts, agent_meta, origin_id
from peerd.sim.maua import (
    CURVE_COLUMNS,
    MAUA_DEFINITION,
    acc_at,
    maua,
    mean_of_client_best,
)
from peerd.sim.provenance import Started
from peerd.sim.runner import SimConfig, mobility_trace
from peerd.sim.train import draw_batches, matrix_to_stack, model_schema, train_batched

KNOWLEDGE_ALGORITHMS = ("fedcache", "isolated", "cached-dfl")
MIXED = ("small", "medium", "large")
#: Bytes of one float16 value on the wire (keys and logits travel as float16).
F16 = 2
LOCAL_EPOCHS = ("client", "mean")
ROUND1_KNOWLEDGE = ("zero", "none")


@dataclass(frozen=True)
class KnowledgeSimConfig:
    dataset: str = "fashion-mnist"
    agents: int = 300
    rounds: int = 50
    dirichlet: float = 1.0
    models: str = "large"  # a model name, or "mixed" (small/medium/large by index mod 3)
    algorithms: tuple[str, ...] = ("fedcache", "cached-dfl")
    lr: float = 0.01
    batch_size: int = 8
    beta: float = 1.5
    temperature: float = 3.0
    r: int = 16
    key_dim: int = 64
    seed: int = 0
    eval_every: int = 1
    distill_form: DistillForm = "code"  # peerd.core.distill: eq18 measured worse at T = 3
    local_epoch: str = "client"
    round1_knowledge: str = "zero"
    index_bytes: int = 4
    targets: tuple[float, ...] = (0.6, 0.7)
    # Cached-DFL's side (the mobility model and its cache)
    capacity: int = 10
    tau_max: float = 5.0
    round_seconds: int = 120

    def validate(self) -> None:
        bad = [a for a in self.algorithms if a not in KNOWLEDGE_ALGORITHMS]
        if bad or not self.algorithms:
            raise ValueError(f"unknown algorithm(s) {bad}; choose from "
                             f"{', '.join(KNOWLEDGE_ALGORITHMS)}")
        if self.agents < 2 or self.rounds < 1 or self.batch_size < 1 or self.eval_every < 1:
            raise ValueError("need agents >= 2 and rounds, batch size, eval-every >= 1")
        if not (self.lr > 0 and self.dirichlet > 0):
            raise ValueError("lr and the Dirichlet concentration must be > 0")
        if self.models != "mixed" and self.models not in MIXED:
            raise ValueError(f"--model must be small, medium, large or mixed in fedcache runs, "
                             f"got {self.models!r}")
        if self.distill_form not in DISTILL_FORMS:
            raise ValueError(f"--distill-form must be one of {', '.join(DISTILL_FORMS)}, got "
                             f"{self.distill_form!r}")
        if self.local_epoch not in LOCAL_EPOCHS:
            raise ValueError(f"--local-epoch must be one of {', '.join(LOCAL_EPOCHS)}, got "
                             f"{self.local_epoch!r}")
        if self.round1_knowledge not in ROUND1_KNOWLEDGE:
            raise ValueError(f"--round1-knowledge must be one of {', '.join(ROUND1_KNOWLEDGE)}"
                             f", got {self.round1_knowledge!r}")
        if self.index_bytes not in (0, 1, 2, 4, 8):
            raise ValueError(f"--index-bytes must be 0, 1, 2, 4 or 8, got {self.index_bytes}")
        if not all(0 < t <= 1 for t in self.targets):
            raise ValueError(f"--targets must be accuracies in (0, 1], got {self.targets}")
        Distillation(self.beta, self.temperature, self.r, self.distill_form)  # validates

    def model_of(self, agent: int) -> str:
        return MIXED[agent % 3] if self.models == "mixed" else self.models


#: ``--json``'s config block names each option as its flag (and the daemon's config) does,
#: not as the field it is kept in here.
_JSON_NAMES = {"r": "neighbours", "models": "model", "round_seconds": "round_interval_s"}


def config_json(config: KnowledgeSimConfig) -> dict[str, Any]:
    """The options of a run, under their flags' names (``--partition dirichlet:A``)."""
    out: dict[str, Any] = {}
    for name, value in asdict(config).items():
        if name == "dirichlet":
            out["partition"] = f"dirichlet:{value:g}"
        else:
            out[_JSON_NAMES.get(name, name)] = value
    out["algorithms"] = list(config.algorithms)
    out["targets"] = list(config.targets)
    return out


@dataclass
class KnowledgeResult:
    config: KnowledgeSimConfig
    #: per algorithm: per evaluated round, (round, mean accuracy, mean of client best so far,
    #: bytes so far) (:data:`~peerd.sim.maua.CURVE_COLUMNS`; MAUA so far is the running
    #: maximum of the second column)
    curves: dict[str, list[tuple[int, float, float, int]]] = field(default_factory=dict)
    #: per algorithm: the paper's MAUA (max over rounds of the mean client accuracy)
    maua: dict[str, float] = field(default_factory=dict)
    #: per algorithm: the mean over clients of each client's best round (not MAUA)
    mean_of_client_best: dict[str, float] = field(default_factory=dict)
    traffic: dict[str, dict[str, int]] = field(default_factory=dict)
    #: per algorithm, per target (as text): the first round reaching it and the bytes by then
    acc_at: dict[str, dict[str, dict[str, int] | None]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"config": config_json(self.config), "maua_definition": MAUA_DEFINITION,
                "maua": self.maua, "mean_of_client_best": self.mean_of_client_best,
                "traffic_bytes": self.traffic, "acc_at": self.acc_at, "info": self.info,
                "curve_columns": list(CURVE_COLUMNS),
                "curves": {a: [list(row) for row in c] for a, c in self.curves.items()}}


# ------------------------------------------------------------------ data


def client_test_split(train_parts: Sequence[np.ndarray], y_train: np.ndarray,
                      y_test: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Each client's test indices, with its training label mix: class c's test samples are
    dealt to clients in proportion to their share of class c in training."""
    k = len(train_parts)
    out: list[list[np.ndarray]] = [[] for _ in range(k)]
    for c in np.unique(y_test):
        have = np.array([(y_train[p] == c).sum() for p in train_parts], dtype=np.float64)
        idx = rng.permutation(np.flatnonzero(y_test == c))
        if have.sum() == 0:
            continue
        cuts = (np.cumsum(have / have.sum())[:-1] * len(idx)).astype(np.int64)
        for a, chunk in enumerate(np.split(idx, cuts)):
            out[a].append(chunk)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in out]


@dataclass
class _Setup:
    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    train: list[np.ndarray]
    test: list[np.ndarray]
    steps: int | list[int]  # one count for every client, or each client's own
    mean_steps: int
    num_classes: int
    input_shape: tuple[int, ...]


def _setup(config: KnowledgeSimConfig) -> _Setup:
    seeds = np.random.SeedSequence(config.seed).spawn(3)
    data = load_dataset(config.dataset)
    parts = partition(data.y_train, config.agents, f"dirichlet:{config.dirichlet}",
                      np.random.default_rng(seeds[0]))
    tests = client_test_split(parts, data.y_train.numpy(), data.y_test.numpy(),
                       np.random.default_rng(seeds[1]))
    mean_steps = math.ceil(np.mean([len(p) for p in parts]) / config.batch_size)
    steps: int | list[int] = mean_steps
    if config.local_epoch == "client":
        steps = [math.ceil(len(p) / config.batch_size) for p in parts]
    return _Setup(data.x_train, data.y_train, data.x_test, data.y_test, parts, tests, steps,
                  mean_steps, data.num_classes, data.input_shape)


# ------------------------------------------------------------------ models as stacks


class _Group:
    """The clients of one architecture: their parameters stacked ``{name: [g, *shape]}``."""

    def __init__(self, kind: str, members: list[int], setup: _Setup, seed: int) -> None:
        self.kind = kind
        self.members = members
        self.model = build_model(kind, setup.input_shape, setup.num_classes, seed=seed)
        self.params_count = count_parameters(self.model)
        init = {n: p.detach() for n, p in self.model.named_parameters()}
        # Every client of an architecture starts from the same seeded init (as a fleet does).
        self.stack = {n: t.expand(len(members), *t.shape).clone() for n, t in init.items()}

    def params_of(self, i: int) -> dict[str, torch.Tensor]:
        return {n: t[i] for n, t in self.stack.items()}

    @torch.no_grad()
    def logits(self, i: int, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = functional_call(self.model, self.params_of(i), (x,))
        return out


def _groups(config: KnowledgeSimConfig, setup: _Setup) -> list[_Group]:
    kinds = sorted({config.model_of(a) for a in range(config.agents)}, key=MIXED.index)
    return [_Group(k, [a for a in range(config.agents) if config.model_of(a) == k], setup,
                   config.seed) for k in kinds]


def _evaluate(groups: Sequence[_Group], setup: _Setup, agents: int) -> np.ndarray:
    acc = np.full(agents, np.nan)
    for g in groups:
        for i, a in enumerate(g.members):
            idx = torch.from_numpy(setup.test[a])
            if idx.numel() == 0:
                continue
            pred = g.logits(i, setup.x_test[idx]).argmax(dim=1)
            acc[a] = float((pred == setup.y_test[idx]).double().mean())
    return acc


# ------------------------------------------------------------------ knowledge fleet


@dataclass
class _KnowledgeOps:
    """The core round's ops for knowledge mode: nothing to blend; distil one epoch."""

    groups: list[_Group]
    setup: _Setup
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


def _acc_at(curve: Sequence[Sequence[float]], targets: Sequence[float]
            ) -> dict[str, dict[str, int] | None]:
    return {f"{t:g}": acc_at(curve, t) for t in targets}


def _metrics(evals: Sequence[np.ndarray]) -> dict[str, float]:
    if not evals:  # no round evaluated yet (eval_every > rounds done)
        return {"maua": math.nan, "mean_of_client_best": math.nan}
    return {"maua": maua(evals), "mean_of_client_best": mean_of_client_best(evals)}


#: Called after every round with the rounds done and the run's outputs so far.
Tick = Callable[[int, dict[str, Any]], None]


def _run_knowledge(config: KnowledgeSimConfig, setup: _Setup, beta: float,
                   progress: Tick) -> dict[str, Any]:
    groups = _groups(config, setup)
    policy = Distillation(beta, config.temperature, config.r, config.distill_form)
    encoder = SampleEncoder(b"peerd-sim", setup.input_shape, config.key_dim)
    keys = [encoder.encode(setup.x[torch.from_numpy(p)].numpy()) for p in setup.train]
    labels = [setup.y[torch.from_numpy(p)].numpy() for p in setup.train]
    cache = KnowledgeCache(config.key_dim, setup.num_classes)
    n_train = setup.x.shape[0]
    evals: list[np.ndarray] = []
    curve: list[tuple[int, float, float, int]] = []
    samples = sum(len(p) for p in setup.train)
    # Traffic, server-equivalent (the paper's count): every key once up with its label and
    # index, then per round every sample's logits and index up and its teacher down (round 1
    # too when eq. 9's zeros are the teachers). Gossip all-to-all (peerd without a server):
    # every origin's batch to each of the K - 1 others, keys once (a row is its id), logits
    # with their ids every round (the knowledge entry's int32 ids).
    key_bytes = samples * (config.key_dim * F16 + 1)  # + a label byte per sample
    logit_bytes = samples * setup.num_classes * F16
    up_bytes = logit_bytes + samples * config.index_bytes
    server = gossip = 0
    distilling = beta > 0
    zero_first = distilling and config.round1_knowledge == "zero"
    if distilling:
        server += key_bytes + samples * config.index_bytes
        gossip += key_bytes * (config.agents - 1)
    agents = [RoundAgent(agent_meta(a, 0, len(p)), ()) for a, p in enumerate(setup.train)]
    for t in range(config.rounds):
        teacher = torch.zeros(n_train, setup.num_classes)
        has = torch.zeros(n_train, dtype=torch.bool)
        if distilling and len(cache):
            for a, part in enumerate(setup.train):
                z, count = cache.teacher_logits(keys[a], labels[a], r=config.r,
                                                exclude=origin_id(a))
                idx = torch.from_numpy(part)
                teacher[idx] = torch.from_numpy(z)
                has[idx] = torch.from_numpy(count > 0)
            server += logit_bytes  # the teachers, down
        elif zero_first and t == 0:
            has[:] = True  # eq. 9: every sample's knowledge starts as C zeros (τ(0) uniform)
            server += logit_bytes  # the zeros, down (the server answers every upload)
        batches = draw_batches(setup.train, setup.steps, config.batch_size, config.seed, t)
        ops = _KnowledgeOps(groups, setup, batches, teacher, has, config.lr)
        cached_dfl_round(agents, clock=Clock.rounds(t), policy=AlphaPolicy.parse("uniform"),
                         rho=0.0, ops=ops, blend=BlendPolicy.NONE, local=policy)
        if distilling:
            for g in groups:
                for i, a in enumerate(g.members):
                    rows = torch.from_numpy(setup.train[a])
                    # float16 on the wire: the cache holds what a peer would receive.
                    z16 = g.logits(i, setup.x[rows]).numpy().astype(np.float16)
                    cache.put(KnowledgeBatch(origin_id(a), t + 1, float(t + 1), keys[a],
                                             labels[a], z16.astype(np.float32)))
            server += up_bytes
            gossip += up_bytes * (config.agents - 1)
        if (t + 1) % config.eval_every == 0 or t + 1 == config.rounds:
            evals.append(_evaluate(groups, setup, config.agents))
            curve.append((t + 1, float(np.nanmean(evals[-1])),
                          mean_of_client_best(evals), server))
        out = {"curve": curve, **_metrics(evals), "acc_at": _acc_at(curve, config.targets),
               "traffic": {"server_equivalent": server, "gossip_all_to_all": gossip},
               "parameters": {g.kind: g.params_count for g in groups},
               "index_rebuilds": cache.rebuilds, "rounds_done": t + 1}
        progress(t + 1, out)
    return out


# ------------------------------------------------------------------ weight fleet


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


def _run_cached_dfl(config: KnowledgeSimConfig, setup: _Setup,
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
    group = _Group("large", list(range(config.agents)), setup, config.seed)
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
            evals.append(_evaluate([group], setup, config.agents))
            curve.append((t + 1, float(np.nanmean(evals[-1])), mean_of_client_best(evals),
                          fleet.moved * fleet.model_bytes))
        out = {"curve": curve, **_metrics(evals), "acc_at": _acc_at(curve, config.targets),
               "local_epoch": "mean",
               "traffic": {"exchanged": fleet.moved * fleet.model_bytes,
                           "models_moved": fleet.moved},
               "parameters": {"large": schema.flat_size}, "rounds_done": t + 1}
        progress(t + 1, out)
    return out


# ------------------------------------------------------------------ driver


def run_knowledge(config: KnowledgeSimConfig,
                  progress: Callable[[str, int], None] | None = None,
                  checkpoint: Callable[[KnowledgeResult], None] | None = None
                  ) -> KnowledgeResult:
    """Every algorithm of ``config`` on one partition; deterministic for a given config.

    ``checkpoint`` gets the result so far after every round (a run cut short by a time
    limit still leaves its curves)."""
    config.validate()
    setup = _setup(config)
    result = KnowledgeResult(config)
    result.info = {"train_samples_per_client_mean": float(np.mean([len(p) for p in setup.train])),
                   "test_samples_per_client_mean": float(np.mean([len(p) for p in setup.test])),
                   "local_steps_per_round": setup.steps,
                   "local_steps_mean_rule": setup.mean_steps, "seconds": {}}
    for alg in config.algorithms:
        start = time.perf_counter()

        def tick(t: int, out: dict[str, Any], alg: str = alg, start: float = start) -> None:
            rest = dict(out)
            result.curves[alg] = list(rest.pop("curve"))
            result.maua[alg] = rest.pop("maua")
            result.mean_of_client_best[alg] = rest.pop("mean_of_client_best")
            result.traffic[alg] = rest.pop("traffic")
            result.acc_at[alg] = rest.pop("acc_at")
            result.info[alg] = rest
            result.info["seconds"][alg] = round(time.perf_counter() - start, 1)
            if progress is not None:
                progress(alg, t)
            if checkpoint is not None:
                checkpoint(result)

        if alg == "cached-dfl":
            _run_cached_dfl(config, setup, tick)
        else:
            _run_knowledge(config, setup, config.beta if alg == "fedcache" else 0.0, tick)
    return result


def knowledge_cli(*, dataset: str, partition: str, agents: int, rounds: int,
                  algorithms: tuple[str, ...], models: str, lr: float, batch_size: int,
                  beta: float, temperature: float, r: int, key_dim: int, seed: int,
                  eval_every: int, capacity: int, tau_max: float, round_seconds: int,
                  out: Path, json_output: bool, distill_form: str = "code",
                  local_epoch: str = "client", round1_knowledge: str = "zero",
                  index_bytes: int = 4, targets: tuple[float, ...] = (0.6, 0.7),
                  provenance: Started | None = None) -> None:
    """``peerd sim --algorithms fedcache,...``: run, write ``out/fedcache.json`` (with the
    run's ``provenance`` record when given, its wall time as of each checkpoint), print.

    Start-up errors are one line on stderr and exit 2."""
    try:
        alpha = check_partition_spec(partition)
        if not partition.startswith("dirichlet:"):
            raise ValueError("fedcache runs need --partition dirichlet:ALPHA (the paper's split)")
        config = KnowledgeSimConfig(
            dataset=dataset, agents=agents, rounds=rounds, dirichlet=alpha, models=models,
            algorithms=algorithms, lr=lr, batch_size=batch_size, beta=beta,
            temperature=temperature, r=r, key_dim=key_dim, seed=seed, eval_every=eval_every,
            capacity=capacity, tau_max=tau_max, round_seconds=round_seconds,
            distill_form=distill_form, local_epoch=local_epoch,  # type: ignore[arg-type]
            round1_knowledge=round1_knowledge, index_bytes=index_bytes, targets=targets)
        config.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None

    def progress(alg: str, t: int) -> None:
        if not json_output:
            print(f"\r{alg} round {t}/{rounds}", end="", file=sys.stderr, flush=True)

    out.mkdir(parents=True, exist_ok=True)
    target = out / "fedcache.json"

    def checkpoint(result: KnowledgeResult) -> None:
        # Written whole and renamed: a run killed mid-write leaves the last complete round.
        tmp = target.with_suffix(".json.tmp")
        doc = result.summary()
        if provenance is not None:
            doc = {**doc, "provenance": provenance.record()}
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(target)

    try:
        result = run_knowledge(config, progress, checkpoint)
    except (DataError, ValueError) as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    summary = result.summary()
    if json_output:
        print(json.dumps(summary))
        return
    print(file=sys.stderr)
    for alg in config.algorithms:
        print(f"{alg:>10}: MAUA {100 * result.maua[alg]:.2f} % (mean of client best "
              f"{100 * result.mean_of_client_best[alg]:.2f} %)  traffic "
              + ", ".join(f"{k} {v / 1e9:.4f} GB" for k, v in result.traffic[alg].items()
                          if k.endswith(("equivalent", "all", "exchanged"))))
        for goal, hit in result.acc_at[alg].items():
            print(f"{'':>10}  acc@{goal}: " + ("not reached" if hit is None else
                  f"round {hit['round']}, {hit['bytes'] / 1e9:.4f} GB"))
    print(f"wrote {out / 'fedcache.json'}")
