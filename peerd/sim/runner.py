"""The round driver: data, mobility, training and every algorithm of a run, side by side.

All algorithms of one run share the data partition, the initial model, the mobility trace
and every agent's mini-batches (see :func:`peerd.sim.train.agent_generator`): the only thing
that differs between them is aggregation, so their curves are directly comparable.

Each round of each algorithm is the core round (:func:`peerd.core.round.cached_dfl_round`)
for all agents at once: the algorithm's fleet blends (:mod:`peerd.sim.algorithms`), this
module has it trained by an engine (:mod:`peerd.sim.engine`: shards here, or over Ray). Owns
the run's loop, timing and records; it must not decide α or the order of a round.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from peerd.core.alpha import AlphaPolicy
from peerd.core.blendrules import RobustRule
from peerd.core.drift import row_distances
from peerd.core.entry import Schema, flatten
from peerd.core.fedbss import FedBSS, WarmupState, next_round
from peerd.core.plan import BlendPlan
from peerd.core.round import (
    PLAIN,
    Anchor,
    LocalPolicy,
    blend_step,
    cached_dfl_round,
    parse_blend,
)
from peerd.learn.data import DATASETS, Dataset, check_partition_spec, load_dataset, partition
from peerd.learn.models import build_model, default_model_kind
from peerd.protocol.encoding import Encoding
from peerd.sim.algorithms import ALGORITHMS, CachedDFL, Contacts, Fleet, make_fleet
from peerd.sim.attacks import Threat, flipped_labels, threat_of
from peerd.sim.engine import Engine, LocalEngine, TrainMode, TrainSetup, TrainTask
from peerd.sim.mobility import GridConfig, ManhattanMobility, contacts
from peerd.sim.train import evaluate, model_schema
from peerd.sim.wirecodec import WireCodec

#: Fields kept here under another name than their flag's (and the daemon config's).
_JSON_NAMES = {"round_seconds": "round_interval_s"}


@dataclass(frozen=True)
class SimConfig:
    dataset: str = "digits"
    partition: str = "shards"
    agents: int = 100
    rounds: int = 100
    capacity: int = 10
    tau_max: float = 5.0
    local_steps: int = 10
    batch_size: int = 64
    lr: float = 0.1
    rho: float = 0.0
    alpha: str = "uniform"
    #: The daemon's ``[learning] blend``: weighted, median, trimmed[:β], clipped[:τ], krum[:f].
    blend: str = "weighted"
    #: The daemon's ``[learning] local_policy``: plain, or fedbss (its warm-up rounds, E).
    local_policy: str = "plain"
    fedbss_warmup_rounds: int = 20
    fedbss_epochs: int = 10
    #: FedBSS step budget: 0 = E full epochs over the admitted samples; K > 0 = K SGD steps
    #: per curriculum round spread over the E epochs (K = local_steps matches plain's budget).
    fedbss_steps: int = 0
    #: Poisoning (:mod:`peerd.sim.attacks`): none, sign-flip[:s], gaussian[:k], label-flip,
    #: alie[:z], ipm[:ε]; and the fraction of agents that attack, in [0, 1).
    attack: str = "none"
    attackers: float = 0.0
    algorithms: tuple[str, ...] = ("cached-dfl", "dfl", "fedavg")
    seed: int = 0
    model: str = ""  # "" = the dataset's default (cnn / mlp / linear)
    round_seconds: int = 120
    speed: float = 13.89
    comm_range: float = 100.0
    blocks: int = 10
    block_length: float = 300.0
    eval_every: int = 1
    #: Cache statistics (summary's cache_avg_*) are averaged from this round on: the first
    #: rounds fill the caches and would pull the averages down (the paper's Table 2 is steady
    #: state). 1 = every round.
    stats_from: int = 1
    eval_samples: int = 0  # 0 = the full test set
    mixed_schema: bool = False  # each agent sees one feature group (tabular data)
    batched: bool = True  # False: the per-agent reference loop (slow; for benchmarks)
    #: Agents per training shard, the unit of work on every engine (:mod:`peerd.sim.engine`):
    #: the floats depend on this cut, never on the engine or its workers.
    shard_agents: int = 100
    #: The daemon's ``[fleet] entry_encoding`` (peerd.protocol.encoding): how cached-DFL's
    #: entries cross the links; float32, float16, bfloat16, int8 or int8:B.
    entry_encoding: str = "float32"

    def validate(self) -> None:
        unknown = [a for a in self.algorithms if a not in ALGORITHMS]
        if unknown or not self.algorithms:
            raise ValueError(f"unknown algorithm(s) {unknown}; choose from {', '.join(ALGORITHMS)}")
        if len(set(self.algorithms)) != len(self.algorithms):
            raise ValueError("an algorithm is listed twice")
        for name in (
            "agents",
            "rounds",
            "local_steps",
            "batch_size",
            "round_seconds",
            "eval_every",
            "stats_from",
            "shard_agents",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1")
        if self.capacity < 0 or self.tau_max < 0 or self.rho < 0 or self.eval_samples < 0:
            raise ValueError("capacity, tau-max, rho and eval-samples must be >= 0")
        if not self.lr > 0:
            raise ValueError("lr must be > 0")
        if self.fedbss_steps < 0:
            raise ValueError("fedbss-steps must be >= 0")
        AlphaPolicy.parse(self.alpha)
        parse_blend(self.blend)
        self.threat()
        self.local()
        if self.dataset not in DATASETS:
            raise ValueError(
                f"unknown dataset {self.dataset!r}; choose one of {', '.join(DATASETS)}"
            )
        check_partition_spec(self.partition)  # before any data is loaded
        if not self.encoding().lossless and set(self.algorithms) & {"dfl", "fedavg"}:
            raise ValueError("entry-encoding applies to cached-dfl (and isolated, which sends "
                             "nothing): dfl and fedavg blend float32 models here")

    def encoding(self) -> Encoding:
        """The entry encoding (ValueError for an unknown one)."""
        return Encoding.parse(self.entry_encoding)

    def local(self) -> LocalPolicy:
        """The local policy (ValueError for an unknown name or bad FedBSS parameters)."""
        if self.local_policy == "plain":
            return PLAIN
        if self.local_policy == "fedbss":
            return FedBSS(warmup_rounds=self.fedbss_warmup_rounds, epochs=self.fedbss_epochs)
        raise ValueError(f"unknown local policy {self.local_policy!r} (plain or fedbss)")

    def threat(self) -> Threat:
        """The run's attack and its seeded attackers (ValueError: bad name or fraction)."""
        return threat_of(self.attack, self.attackers, self.agents, self.seed)

    def to_json(self) -> dict[str, Any]:
        """The options of the run, under their flags' names (the daemon config's, where it has
        the knob): ``--json``'s and summary.json's config block."""
        d = {_JSON_NAMES.get(k, k): v for k, v in asdict(self).items()}
        d["algorithms"] = list(self.algorithms)
        d["attacker_count"] = len(self.threat().attackers)
        return d


@dataclass
class RoundRecord:
    round: int  # rounds completed (1-based); accuracy is that of the models after aggregation
    algorithm: str
    accuracy_mean: float
    accuracy_std: float
    accuracy_min: float
    accuracy_max: float
    train_loss: float
    #: Mean over (honest) agents of ‖trained − x̄‖₂, x̄ the blend the round trained from
    #: (lecture §16.1's local drift; float64, :func:`peerd.core.drift.row_distances`).
    drift_mean: float
    cache_avg_models: float
    cache_avg_age: float
    contacts: int  # distinct pairs that met this round
    seconds: float  # wall time of training + aggregation + evaluation


@dataclass
class SimResult:
    config: SimConfig
    records: list[RoundRecord] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The ``--json`` document of the issue."""
        results: dict[str, Any] = {}
        for alg in self.config.algorithms:
            rows = [r for r in self.records if r.algorithm == alg]
            evaluated = [r for r in rows if not math.isnan(r.accuracy_mean)]
            final = evaluated[-1] if evaluated else None
            cache = [r for r in rows if not math.isnan(r.cache_avg_models)
                     and r.round >= self.config.stats_from]
            ages = [r.cache_avg_age for r in cache if not math.isnan(r.cache_avg_age)]
            drifts = [r.drift_mean for r in rows]
            sent = self.info.get("exchange", {}).get("bytes") if alg == "cached-dfl" else None
            results[alg] = {
                "final_accuracy_mean": final.accuracy_mean if final else None,
                "final_accuracy_std": final.accuracy_std if final else None,
                "curve": [[r.round, r.accuracy_mean] for r in evaluated],
                "cache_avg_models": float(np.mean([r.cache_avg_models for r in cache]))
                if cache
                else None,
                "cache_avg_age": float(np.mean(ages)) if ages else None,
                "drift_mean": float(np.mean(drifts)) if drifts else None,
                "drift_curve": [[r.round, r.drift_mean] for r in rows],
                # Entry payload bytes the exchanges moved into caches, per round, all agents.
                "bytes_per_round": float(np.mean(sent)) if sent else None,
            }
        return {"config": self.config.to_json(), "results": results}


ProgressFn = Callable[[int, str], None]


def _mixed_schema_data(
    data: Dataset, parts: list[np.ndarray]
) -> tuple[torch.Tensor, list[np.ndarray]]:
    """Agent a sees only feature group ``a % G``; other columns are missing (0 = the mean,
    since features are standardised). Built as G masked copies of the training set."""
    groups = data.feature_groups
    if not groups:
        raise ValueError(f"dataset {data.name!r} has no feature groups for --mixed-schema")
    n = data.x_train.shape[0]
    copies = []
    for lo, hi in groups:
        masked = torch.zeros_like(data.x_train)
        masked[:, lo:hi] = data.x_train[:, lo:hi]
        copies.append(masked)
    shifted = [p + (a % len(groups)) * n for a, p in enumerate(parts)]
    return torch.cat(copies), shifted


def mobility_trace(config: SimConfig, rng: np.random.Generator) -> Callable[[], list[np.ndarray]]:
    grid = GridConfig(
        blocks_x=config.blocks,
        blocks_y=config.blocks,
        block_length=config.block_length,
        speed=config.speed,
        comm_range=config.comm_range,
    )
    world = ManhattanMobility(grid, config.agents, rng)

    def one_round() -> list[np.ndarray]:
        ticks = []
        for _ in range(config.round_seconds):
            world.step()
            ticks.append(contacts(world.positions(), grid.comm_range))
        return ticks

    return one_round


Trainer = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class _Ops:
    """The core round's ops for one fleet: its blend and the run's training, timed apart.

    Training ignores the anchor kinds: the functional update keeps its starting point, the
    blend, as x̄ with no copy (a published anchor has the same values; ρ = 0 reads none)."""

    fleet: Fleet
    trainer: Trainer
    blend_s: float = 0.0
    train_s: float = 0.0
    #: FedBSS: the curriculum round's training, and every agent's warm-up state (kept by
    #: the run across rounds; updated here).
    curriculum_trainer: Trainer | None = None
    warmup: list[WarmupState] = field(default_factory=list)

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        start = time.perf_counter()
        self.fleet.blend(plans)
        self.blend_s = time.perf_counter() - start

    def blend_robust(self, plans: Sequence[BlendPlan], rule: RobustRule) -> None:
        start = time.perf_counter()
        self.fleet.blend_robust(plans, rule)
        self.blend_s = time.perf_counter() - start

    def train(self, anchors: Sequence[Anchor]) -> tuple[torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        out = self.trainer(self.fleet.matrix)
        self.train_s = time.perf_counter() - start
        return out

    def curriculum(self, anchors: Sequence[Anchor],
                   policy: FedBSS) -> tuple[torch.Tensor, torch.Tensor]:
        """Warm-up rounds are the plain (batched) training itself; then the curriculum. The
        simulator's data never grows, so every agent leaves warm-up in the same round."""
        steps = [next_round(policy, w, n) for w, n in
                 zip(self.warmup, self.fleet.num_examples, strict=True)]
        self.warmup[:] = [w for _, w in steps]
        if not any(c for c, _ in steps) or self.curriculum_trainer is None:
            return self.train(anchors)
        start = time.perf_counter()
        out = self.curriculum_trainer(self.fleet.matrix)
        self.train_s = time.perf_counter() - start
        return out


@dataclass(frozen=True)
class _Trained:
    """A round trained and published whose record waits for its blend (the next round's)."""

    train_loss: float
    drift_mean: float
    contacts: int
    seconds: float


def _closed(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    raise RuntimeError("the blend that closes a run trains nothing")


def _task(config: SimConfig, t: int, mode: TrainMode, policy: FedBSS | None = None) -> TrainTask:
    return TrainTask(
        mode=mode, round_index=t, seed=config.seed, steps=config.local_steps,
        batch_size=config.batch_size, lr=config.lr, rho=config.rho, policy=policy,
        fedbss_steps=config.fedbss_steps)


def _trainer(config: SimConfig, engine: Engine, t: int) -> Trainer:
    """Round ``t``'s local update for all agents (batched, or the per-agent reference)."""
    task = _task(config, t, "batched" if config.batched else "loop")
    return lambda matrix: engine.train(task, matrix)


def _curriculum_trainer(config: SimConfig, local: LocalPolicy, engine: Engine,
                        t: int) -> Trainer | None:
    """Round ``t``'s FedBSS curriculum for all agents (None: the plain policy)."""
    if not isinstance(local, FedBSS):
        return None
    task = _task(config, t, "curriculum", local)
    return lambda matrix: engine.train(task, matrix)


def run(config: SimConfig, progress: ProgressFn | None = None,
        engine: Engine | None = None) -> SimResult:
    """Run every algorithm of ``config``; deterministic for a given config, whichever
    ``engine`` trains (default: :class:`peerd.sim.engine.LocalEngine`)."""
    config.validate()
    seeds = np.random.SeedSequence(config.seed).spawn(3)
    data = load_dataset(config.dataset)
    parts = partition(
        data.y_train, config.agents, config.partition, np.random.default_rng(seeds[0])
    )
    x_train, agent_idx = data.x_train, parts
    if config.mixed_schema:
        x_train, agent_idx = _mixed_schema_data(data, parts)
    y_train = data.y_train.repeat(len(data.feature_groups)) if config.mixed_schema else data.y_train
    x_test, y_test = data.x_test, data.y_test
    if config.eval_samples and config.eval_samples < len(y_test):
        pick = torch.from_numpy(
            np.sort(np.random.default_rng(seeds[1]).permutation(len(y_test))[: config.eval_samples])
        )
        x_test, y_test = x_test[pick], y_test[pick]

    kind = config.model or default_model_kind(config.dataset)
    model = build_model(kind, data.input_shape, data.num_classes, seed=config.seed)
    schema = model_schema(model)
    init = flatten(dict(model.named_parameters()), schema)
    num_examples = [len(p) for p in parts]
    policy = AlphaPolicy.parse(config.alpha)
    rule = parse_blend(config.blend)
    encoding = config.encoding()
    wire = None if encoding.lossless else WireCodec(schema, encoding)
    local = config.local()
    threat = config.threat()
    if threat.active and threat.attack.kind == "label-flip":
        y_train = flipped_labels(y_train, agent_idx, threat.attackers, data.num_classes)
    engine = engine if engine is not None else LocalEngine()
    engine.load(TrainSetup(model, x_train, y_train, agent_idx), config.shard_agents)
    fleets = {
        alg: make_fleet(
            alg,
            init.expand(config.agents, -1).clone(),
            num_examples,
            policy=policy,
            capacity=config.capacity,
            tau_max=config.tau_max,
            wire=wire,
        )
        for alg in config.algorithms
    }
    needs_mobility = any(a in ("cached-dfl", "dfl") for a in config.algorithms)
    next_round = mobility_trace(config, np.random.default_rng(seeds[2])) if needs_mobility else None
    result = SimResult(config)
    result.info = {
        "model": kind,
        "parameters": schema.flat_size,
        "train_samples": int(data.x_train.shape[0]),
        "test_samples": len(y_test),
        "examples_per_agent_min": min(num_examples),
        "examples_per_agent_max": max(num_examples),
        # Where training ran: not in the summary, which is the same on every engine.
        "engine": engine.name,
        "workers": engine.workers,
    }
    train_time = 0.0
    agent_steps = 0
    trained: dict[str, _Trained] = {}
    warmups = {alg: [WarmupState()] * config.agents for alg in config.algorithms}
    # A core round opens with the blend of the round before it, so a round's record (the
    # models after aggregation) is written inside the next round, once they are blended; the
    # last round is closed by a blend alone.
    for t in range(config.rounds + 1):
        closing = t == config.rounds
        trainer = _closed if closing else _trainer(config, engine, t)
        ticks = next_round() if next_round is not None and not closing else []
        met = np.zeros((config.agents, config.agents), dtype=bool)
        for pairs in ticks:
            met[pairs[:, 0], pairs[:, 1]] = True
        met |= met.T
        curriculum = _curriculum_trainer(config, local, engine, t)
        for alg, fleet in fleets.items():
            ops = _Ops(fleet, trainer, curriculum_trainer=curriculum, warmup=warmups[alg])
            agents = fleet.agents()
            outcome = None
            if closing:
                blend_step(agents, clock=fleet.clock, policy=fleet.policy, ops=ops, blend=rule)
            else:
                outcome = cached_dfl_round(
                    agents, clock=fleet.clock, policy=fleet.policy, rho=config.rho, ops=ops,
                    blend=rule, local=local,
                )
            if t > 0:
                result.records.append(
                    _record(t, alg, fleet, trained[alg], ops.blend_s, config, model, schema,
                            x_test, y_test)
                )
                if progress is not None:
                    progress(t, alg)
            if outcome is None:
                continue
            start = time.perf_counter()
            models, loss = outcome.trained
            # Local drift, before any poisoning: fleet.matrix is still the x̄ trained from.
            drift = threat.honest_rows(row_distances(models, fleet.matrix).unsqueeze(1))
            models = threat.publish(models, fleet.matrix, t)  # fleet.matrix: still x̄
            fleet.publish(models, t, Contacts(ticks, met))
            trained[alg] = _Trained(
                float(loss.mean()), float(drift.mean()), int(met.sum() // 2),
                ops.train_s + time.perf_counter() - start,
            )
            train_time += ops.train_s
            agent_steps += config.agents * config.local_steps
    result.info["train_seconds"] = train_time
    result.info["agent_steps_per_second"] = agent_steps / train_time if train_time else None
    cached = fleets.get("cached-dfl")
    result.info["cache_merges"] = cached.merges if isinstance(cached, CachedDFL) else 0
    if isinstance(cached, CachedDFL):
        result.info["exchange"] = {
            "entry_encoding": str(encoding),
            "float32_payload_bytes": 4 * schema.flat_size,
            "payload_bytes": cached.payload_sizes(),
            "transfers": cached.transfers, "bytes": cached.transfer_bytes,
        }
    return result


def _record(t: int, alg: str, fleet: Fleet, trained: _Trained, blend_s: float,
            config: SimConfig, model: nn.Module, schema: Schema, x_test: torch.Tensor,
            y_test: torch.Tensor) -> RoundRecord:
    """Round ``t`` (1-based) of ``alg``: its training, and its models as just blended."""
    start = time.perf_counter()
    acc = np.full(1, np.nan)
    if t % config.eval_every == 0 or t == config.rounds:
        acc = evaluate(model, config.threat().honest_rows(fleet.matrix), schema, x_test, y_test)
    stats = fleet.stats()
    return RoundRecord(
        round=t,
        algorithm=alg,
        accuracy_mean=float(acc.mean()),
        accuracy_std=float(acc.std()),
        accuracy_min=float(acc.min()),
        accuracy_max=float(acc.max()),
        train_loss=trained.train_loss,
        drift_mean=trained.drift_mean,
        cache_avg_models=stats.avg_models if stats else float("nan"),
        cache_avg_age=stats.avg_age if stats else float("nan"),
        contacts=trained.contacts,
        seconds=trained.seconds + blend_s + time.perf_counter() - start,
    )
