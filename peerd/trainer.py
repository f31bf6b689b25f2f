"""The train/blend round of a daemon: blend the cache into x̄, K proximal steps, evaluate.

Runs in a worker thread (``trio.to_thread``): the network never waits for training and
training never waits for the network. It reads an immutable snapshot of the cache taken on
the event-loop thread and returns the new parameters; it never touches ``NodeState``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from peerd.core.alpha import AlphaPolicy
from peerd.core.blend import blend
from peerd.core.drift import drift
from peerd.core.entry import CacheItem, Entry, EntryMeta, Schema
from peerd.core.local_update import LossName, local_update
from peerd.core.plan import blend_plan
from peerd.core.staleness import Clock
from peerd.tasks import Task


@dataclass(frozen=True, slots=True)
class RoundInput:
    own_id: str
    cache: tuple[CacheItem, ...]  # payloads are peerd.node.Held (entry + message)
    peers: tuple[Entry, ...]  # the cache's entries, same order
    clock: Clock
    policy: AlphaPolicy
    steps: int
    batch_size: int
    lr: float
    rho: float
    seed: int  # per-round batch order: derived from the node id and round by the caller


@dataclass(frozen=True, slots=True)
class RoundOutput:
    params: dict[str, torch.Tensor]
    alpha: dict[str, float]  # origin -> α used in this round's blend (own included)
    drift: dict[str, float]  # origin -> distance between the trained model and that entry
    examples: int
    train_loss: float
    val_loss: float
    val_accuracy: float | None  # None for regression


def evaluate(model: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: LossName
             ) -> tuple[float, float | None]:
    """Validation loss and (classification) accuracy, without touching gradients."""
    if len(X) == 0:
        return math.nan, None
    model.eval()
    with torch.no_grad():
        out = model(X)
        if loss == "cross_entropy":
            value = float(nn.functional.cross_entropy(out, y))
            return value, float((out.argmax(dim=1) == y).float().mean())
        pred = out.squeeze(-1) if out.dim() == y.dim() + 1 else out
        return float(nn.functional.mse_loss(pred, y)), None


def run_round(model: nn.Module, task: Task, inp: RoundInput) -> RoundOutput:
    """One round: x̄ = blend(own, cache); K proximal steps from x̄; evaluate."""
    data = task.data()  # re-read every round: local data may have grown
    n = len(data.y_train)
    # Read-only use: the blend reads these before load_state_dict overwrites the model.
    own_params = {k: v.detach() for k, v in model.state_dict().items()}
    alphas: dict[str, float] = {inp.own_id: 1.0}
    if inp.peers:
        # Only the example count and age matter to α; the digest is never looked at here,
        # so the (44 MB) model is not hashed for it.
        own_meta = EntryMeta(inp.own_id, 0, inp.clock.now, Schema.of(own_params).id, n, "")
        origins, weights = blend_plan(own_meta, inp.cache, inp.clock, inp.policy)
        members: Sequence[dict[str, torch.Tensor]] = [
            own_params, *({k: v for k, v in e.params.items()} for e in inp.peers)
        ]
        model.load_state_dict(blend(members, weights))
        alphas = dict(zip(origins, (float(w) for w in weights), strict=True))
    result = local_update(model, data.X_train, data.y_train, steps=inp.steps,
                          batch_size=inp.batch_size, lr=inp.lr, rho=inp.rho, loss=task.loss,
                          generator=torch.Generator().manual_seed(inp.seed))
    val_loss, acc = evaluate(model, data.X_val, data.y_val, task.loss)
    trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # §3.10: how far each cached peer model is from where local training took us.
    distances = {e.meta.origin: drift(trained, dict(e.params)) for e in inp.peers}
    return RoundOutput(
        params=trained,
        alpha=alphas, drift=distances, examples=n, train_loss=result.mean_loss,
        val_loss=val_loss, val_accuracy=acc,
    )
