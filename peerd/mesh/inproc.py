"""An in-process mesh: N nodes on one machine running the Cached-DFL round, no network.

This is ``peerd demo --in-process``: every node keeps its own non-IID slice of scikit-learn's
digits and runs the daemon's round (:func:`peerd.core.round.cached_dfl_round`: blend with α,
K proximal steps, publish); then random pairs of nodes meet and swap caches (each received
entry validated, then merged with τ_max and C). Only the network is a function call here; no
sockets, threads or processes, and no file but the bundled dataset. An isolated baseline
(same nodes, same seeds, no meetings) shows what the mesh adds. It must not order or decide a
round itself (the core round does) nor use a global RNG: every draw comes from ``cfg.seed``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from peerd.core.alpha import AlphaPolicy
from peerd.core.blend import blend
from peerd.core.cache import merge
from peerd.core.entry import CacheItem, Entry, EntryMeta, Schema
from peerd.core.local_update import LocalResult, local_update
from peerd.core.plan import BlendPlan
from peerd.core.round import Anchor, RoundAgent, blend_step, cached_dfl_round
from peerd.core.staleness import Clock
from peerd.core.validate import RejectionAudit, ValidationLimits, validate_entry
from peerd.learn.data import load_dataset
from peerd.learn.models import build_model


@dataclass(frozen=True, slots=True)
class MeshConfig:
    nodes: int = 4
    rounds: int = 30
    capacity: int = 3
    tau_max: int = 5  # rounds: all in-process nodes share one round counter
    local_steps: int = 10
    batch_size: int = 32
    lr: float = 0.1
    rho: float = 0.01
    alpha: str = "examples"
    meet_probability: float = 0.5  # chance that a given pair of nodes meets in a round
    classes_per_node: int = 3
    seed: int = 0


@dataclass
class Node:
    id: str
    model: nn.Module
    X: torch.Tensor
    y: torch.Tensor
    gen: torch.Generator
    version: int = 0
    cache: list[CacheItem] = field(default_factory=list)
    own: Entry | None = None
    audit: RejectionAudit = field(default_factory=RejectionAudit)
    accuracy: float = 0.0
    train_loss: float = float("nan")

    def params(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def agent(self, schema: Schema) -> RoundAgent:
        """What the round reads: own origin and example count, the cache; the model equals
        the own entry from its publication until the next blend."""
        own = self.own.meta if self.own is not None else EntryMeta(
            self.id, self.version, float(self.version), schema.id, len(self.y), "")
        return RoundAgent(own, tuple(self.cache), published=self.own is not None)


@dataclass(frozen=True, slots=True)
class NodeReport:
    id: str
    round: int
    version: int
    cache: tuple[tuple[str, int, int], ...]  # (origin, version, age in rounds)
    val_accuracy: float
    train_loss: float
    rejected: dict[str, int]


@dataclass(frozen=True, slots=True)
class RoundReport:
    round: int
    nodes: tuple[NodeReport, ...]
    isolated_accuracy: tuple[float, ...]


def _slices(y: np.ndarray, cfg: MeshConfig) -> list[np.ndarray]:
    """Non-IID: node i sees `classes_per_node` consecutive classes (wrapping around)."""
    classes = int(y.max()) + 1
    out = []
    for i in range(cfg.nodes):
        mine = [(i * cfg.classes_per_node // 2 + c) % classes for c in range(cfg.classes_per_node)]
        out.append(np.flatnonzero(np.isin(y, mine)))
    return out


def _accuracy(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(X).argmax(dim=1) == y).float().mean())


def run_mesh(cfg: MeshConfig) -> Iterator[RoundReport]:
    """Run ``cfg.rounds`` rounds, yielding a report after each (for live display).

    A report shows the models after aggregation, which is the blend that opens the next
    round: round t's report comes once round t + 1 has blended, and a blend alone closes
    the last round.
    """
    if cfg.nodes < 2:
        raise ValueError("a mesh needs at least 2 nodes")
    ds = load_dataset("digits")
    parts = _slices(ds.y_train.numpy(), cfg)
    policy = AlphaPolicy.parse(cfg.alpha)
    limits = ValidationLimits()
    rng = random.Random(cfg.seed)

    def make(i: int) -> Node:
        idx = torch.from_numpy(parts[i])
        model = build_model("mlp", ds.input_shape, ds.num_classes, seed=cfg.seed)  # shared init
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + i)
        return Node(f"node{i}", model, ds.x_train[idx], ds.y_train[idx], gen)

    mesh = [make(i) for i in range(cfg.nodes)]
    alone = [make(i) for i in range(cfg.nodes)]  # never meet: their caches stay empty
    nodes = mesh + alone
    schema = Schema.of(mesh[0].params())
    ops = _MeshOps(nodes, cfg, ds.x_test, ds.y_test)

    def report(t: int) -> RoundReport:
        return RoundReport(
            round=t,
            nodes=tuple(
                NodeReport(n.id, t, n.version,
                           tuple((i.meta.origin, i.meta.version, t - i.meta.version)
                                 for i in n.cache),
                           n.accuracy, n.train_loss, n.audit.as_dict())
                for n in mesh
            ),
            isolated_accuracy=tuple(n.accuracy for n in alone),
        )

    for t in range(1, cfg.rounds + 1):
        # Blend what the caches held at the end of round t - 1, train, publish (every round).
        outcome = cached_dfl_round([n.agent(schema) for n in nodes], clock=Clock.rounds(t - 1),
                                   policy=policy, rho=cfg.rho, ops=ops)
        if t > 1:
            yield report(t - 1)
        for node, result in zip(nodes, outcome.trained, strict=True):
            node.train_loss = result.mean_loss
            node.version = t
            node.own = Entry.create(origin=node.id, version=t, created_at=float(t),
                                    num_examples=len(node.y), params=node.params())
        clock = Clock.rounds(t)
        for a in range(cfg.nodes):  # random pairwise meetings swap caches
            for b in range(a + 1, cfg.nodes):
                if rng.random() < cfg.meet_probability:
                    _exchange(mesh[a], mesh[b], schema, limits, clock, cfg)
                    _exchange(mesh[b], mesh[a], schema, limits, clock, cfg)
        for node in mesh:  # age out what expired by the end of the round
            node.cache = list(merge(node.cache, [], clock=clock, tau_max=cfg.tau_max,
                                    capacity=cfg.capacity, own_origin=node.id).cache)
    blend_step([n.agent(schema) for n in nodes], clock=Clock.rounds(cfg.rounds), policy=policy,
               ops=ops)
    yield report(cfg.rounds)


@dataclass
class _MeshOps:
    """The mesh's heavy steps for the core round: stacked blends, one local update per node."""

    nodes: list[Node]
    cfg: MeshConfig
    x_test: torch.Tensor
    y_test: torch.Tensor

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        for node, plan in zip(self.nodes, plans, strict=True):
            if not plan.alone:
                assert node.own is not None  # a node with a cache has published
                models = [node.own.params] + [_payload(item).params for item in node.cache]
                node.model.load_state_dict(blend(models, plan.alpha))
            # The report's accuracy: the model after aggregation, before it trains again.
            node.accuracy = _accuracy(node.model, self.x_test, self.y_test)

    def train(self, anchors: Sequence[Anchor]) -> list[LocalResult]:
        cfg = self.cfg
        out = []
        for node, anchor in zip(self.nodes, anchors, strict=True):
            published = node.own.params if node.own is not None else None
            out.append(local_update(
                node.model, node.X, node.y, steps=cfg.local_steps, batch_size=cfg.batch_size,
                lr=cfg.lr, rho=cfg.rho, loss="cross_entropy", generator=node.gen,
                anchor=published if anchor is Anchor.PUBLISHED else None))
        return out


def _payload(item: CacheItem) -> Entry:
    assert isinstance(item.payload, Entry)
    return item.payload


def _exchange(
    receiver: Node, sender: Node, schema: Schema, limits: ValidationLimits, clock: Clock,
    cfg: MeshConfig,
) -> None:
    """`sender` hands over its own entry and its cache; `receiver` validates, then merges."""
    assert sender.own is not None
    offered = [sender.own] + [_payload(i) for i in sender.cache]
    received = []
    for entry in offered:
        rejection = validate_entry(entry, schema, limits, now=clock.now)
        if rejection is not None:
            receiver.audit.record(entry.meta.origin, rejection)
            continue
        received.append(CacheItem(entry.meta, sender.id, clock.now, payload=entry))
    result = merge(receiver.cache, received, clock=clock, tau_max=cfg.tau_max,
                   capacity=cfg.capacity, own_origin=receiver.id)
    receiver.audit.add(result.dropped)
    receiver.cache = list(result.cache)
