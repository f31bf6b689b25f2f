"""The daemon's knowledge round: one ``nn.Module`` distilled through the core round.

Knowledge mode (FedCache without a server) per round: the peers' knowledge, joined with
their keys (:meth:`peerd.node.knowstate.KnowledgeState.batches`), fills a
:class:`peerd.learn.knowcache.KnowledgeCache`; for every local training sample the teacher
is the mean logits of its R nearest same-label keys of other origins (eq. 17); the model
trains K steps of CE + β·KL towards them (:class:`peerd.core.distill.Distillation`) through
:func:`peerd.core.round.cached_dfl_round` with the ``none`` blend; then its logits on the
local samples are what the node publishes. Also here: the node's model choice
(``[task] model``) and the fleet's knowledge schema, both fixed at start-up.

Runs in a worker thread like :mod:`peerd.learn.trainer`: it never touches ``NodeState``,
signs nothing and reads no clock.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from peerd.core.alpha import AlphaPolicy
from peerd.core.distill import Distillation, distill_local_update
from peerd.core.entry import EntryMeta
from peerd.core.local_update import LocalResult
from peerd.core.plan import BlendPlan
from peerd.core.round import Anchor, BlendPolicy, RoundAgent, cached_dfl_round
from peerd.core.staleness import Clock
from peerd.learn.keys import KEY_DOMAIN, SampleEncoder
from peerd.learn.knowcache import KnowledgeBatch, KnowledgeCache
from peerd.learn.models import MODELS, build_model
from peerd.learn.tasks import FLEET_INIT_SEED, Task, TaskData, TaskError
from peerd.learn.trainer import evaluate
from peerd.protocol.knowledge import KnowledgeSchema
from peerd.protocol.limits import MAX_LOGIT_ABS

#: Rows per forward pass when computing the logits a node publishes.
_LOGIT_BATCH = 256


def task_model(task: Task, name: str | None) -> nn.Module:
    """``[task] model``: the task's own model (None), a built-in (peerd.learn.models) sized
    for the task's data, or ``package.module:attr`` called with ``(input_shape,
    num_classes)``. Initialised from the fleet-wide seed, as the task's own model is."""
    if name is None:
        return task.model()
    data = task.data()
    input_shape = tuple(int(d) for d in data.X_train.shape[1:])
    if task.loss != "cross_entropy":
        raise TaskError(f"[task] model {name!r} needs a classification task")
    num_classes = _classes(task, data)
    if name in MODELS:
        return build_model(name, input_shape, num_classes, seed=FLEET_INIT_SEED)
    module_name, _, attr = name.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise TaskError(f"cannot load model {name!r}: {exc}") from exc
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(FLEET_INIT_SEED)
        model = factory(input_shape, num_classes)
    if not isinstance(model, nn.Module):
        raise TaskError(f"{name!r} returned {type(model).__name__}, not an nn.Module")
    return model


def _classes(task: Task, data: TaskData) -> int:
    ds = getattr(task, "_ds", None)  # the demo datasets know their label space
    if ds is not None and isinstance(getattr(ds, "num_classes", None), int):
        return int(ds.num_classes)
    known = getattr(task, "num_classes", 0)
    return int(known) if known else int(data.y_train.max()) + 1


def knowledge_schema(fleet_id: bytes, task: Task, model: nn.Module, *, key_dim: int,
                     max_samples: int) -> tuple[KnowledgeSchema, SampleEncoder]:
    """The fleet's knowledge schema and sample encoder, from the task's inputs and the
    model's output width (the label space); never from the architecture."""
    data = task.data()
    shape = tuple(int(d) for d in data.X_train.shape[1:])
    with torch.no_grad():
        model.eval()
        classes = int(model(data.X_train[:1]).shape[-1])
    encoder = SampleEncoder(fleet_id, shape, key_dim)
    name = f"{KEY_DOMAIN.decode()} {'x'.join(map(str, shape))}"
    schema = KnowledgeSchema(key_dim=key_dim, num_classes=classes, encoder=name,
                             max_samples=max_samples)
    return schema, encoder


@dataclass(frozen=True, slots=True)
class KnowledgeRoundInput:
    own_id: str
    clock: Clock
    #: The peers' knowledge (origin, version, created_at, keys, labels, logits).
    peers: Sequence[KnowledgeBatch]
    policy: Distillation
    steps: int
    batch_size: int
    lr: float
    seed: int
    #: Eq. 9's start: a sample no peer's knowledge reaches distils towards C zero logits
    #: (τ(0), uniform) instead of cross-entropy only (the node's first round, by default).
    zero_untaught: bool = False


@dataclass(frozen=True, slots=True)
class KnowledgeRoundOutput:
    #: The trained model's logits on the published samples (rows 0..n-1 of the training
    #: set), float32, clipped to the protocol's MAX_LOGIT_ABS.
    logits: npt.NDArray[np.float32]
    examples: int
    train_loss: float
    val_loss: float
    val_accuracy: float | None
    #: Local samples that found at least one neighbour (distilled, not only CE).
    taught: int
    peers: int


def run_knowledge_round(model: nn.Module, data: TaskData, keys: npt.NDArray[np.float32],
                        cache: KnowledgeCache, inp: KnowledgeRoundInput,
                        publish_rows: int) -> KnowledgeRoundOutput:
    """Fill ``cache`` with the peers' knowledge, distil K steps through the core round, and
    compute the logits of the first ``publish_rows`` training samples."""
    held = set(cache.origins())
    current = {b.origin for b in inp.peers}
    for origin in held - current:
        cache.drop(origin)
    for batch in inp.peers:
        if cache.version_of(batch.origin) != batch.version:
            cache.put(batch)
    labels = data.y_train.numpy()
    teacher, counts = cache.teacher_logits(keys, labels, r=inp.policy.r, exclude=inp.own_id)
    taught = int((counts > 0).sum())  # real teachers only, not eq. 9's zeros
    if inp.zero_untaught:
        counts = np.where(counts > 0, counts, 1)  # their teacher rows are zeros already
    n = len(data.y_train)
    own_meta = EntryMeta(inp.own_id, 0, inp.clock.now, "", n, "", "knowledge")
    ops = _DistillOps(model, data, torch.from_numpy(teacher), torch.from_numpy(counts), inp)
    outcome = cached_dfl_round([RoundAgent(own_meta, ())], clock=inp.clock,
                               policy=AlphaPolicy.parse("uniform"), rho=0.0, ops=ops,
                               blend=BlendPolicy.NONE, local=inp.policy)
    result: LocalResult = outcome.trained
    val_loss, acc = evaluate(model, data.X_val, data.y_val, "cross_entropy",
                             batch_size=inp.batch_size)
    logits = own_logits(model, data.X_train[:publish_rows])
    return KnowledgeRoundOutput(logits=logits, examples=n, train_loss=result.mean_loss,
                                val_loss=val_loss, val_accuracy=acc,
                                taught=taught, peers=len(inp.peers))


def own_logits(model: nn.Module, X: torch.Tensor) -> npt.NDArray[np.float32]:
    model.eval()
    parts = []
    with torch.no_grad():
        for lo in range(0, len(X), _LOGIT_BATCH):
            parts.append(model(X[lo:lo + _LOGIT_BATCH]).float())
    out = torch.cat(parts).numpy() if parts else np.zeros((0, 0), np.float32)
    # Finite and inside the protocol's bound, else peers would refuse the whole entry.
    out = np.nan_to_num(out, nan=0.0, posinf=MAX_LOGIT_ABS, neginf=-MAX_LOGIT_ABS)
    return np.clip(out, -MAX_LOGIT_ABS, MAX_LOGIT_ABS).astype(np.float32)


def encode_keys(encoder: SampleEncoder, X: torch.Tensor) -> npt.NDArray[np.float32]:
    keys = encoder.encode(X.numpy())
    return np.ascontiguousarray(keys, dtype=np.float32)


class _DistillOps:
    """KnowledgeOps for one ``nn.Module``: no blend, K distillation steps in place."""

    def __init__(self, model: nn.Module, data: TaskData, teacher: torch.Tensor,
                 counts: torch.Tensor, inp: KnowledgeRoundInput) -> None:
        self.model, self.data, self.teacher, self.counts, self.inp = (
            model, data, teacher, counts, inp)

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        raise AssertionError("knowledge mode blends nothing")  # BlendPolicy.NONE

    def train(self, anchors: Sequence[Anchor]) -> LocalResult:
        return self.distill(anchors, Distillation(beta=0.0))

    def distill(self, anchors: Sequence[Anchor], policy: Distillation) -> LocalResult:
        model = self.model
        model.train()
        return distill_local_update(
            model, self.data.X_train, self.data.y_train, self.teacher, self.counts,
            steps=self.inp.steps, batch_size=self.inp.batch_size, lr=self.inp.lr,
            policy=policy, generator=torch.Generator().manual_seed(self.inp.seed))


def isolated_accuracy(model: nn.Module, data: TaskData, *, rounds: int, steps: int,
                      batch_size: int, lr: float, seed: int) -> float:
    """Accuracy of the same training without any peer (β = 0 throughout): the baseline a
    knowledge-mode node must beat (tests, benchmarks)."""
    for r in range(rounds):
        distill_local_update(model, data.X_train, data.y_train,
                             torch.zeros(len(data.y_train), 1), torch.zeros(len(data.y_train),
                                                                             dtype=torch.int64),
                             steps=steps, batch_size=batch_size, lr=lr,
                             policy=Distillation(beta=0.0),
                             generator=torch.Generator().manual_seed(seed + r))
    _, acc = evaluate(model, data.X_val, data.y_val, "cross_entropy", batch_size=batch_size)
    return math.nan if acc is None else acc
