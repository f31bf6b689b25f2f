"""What a round mode (``weights.py``, ``knowledge.py``, ``cordial.py``) uses of the daemon.

:class:`peerd.daemon.daemon.Daemon` imports the modes, so they cannot import it back; each
declares the attributes it reads as a :class:`typing.Protocol` built on :class:`ModeHost`,
the part they share, and the rounds' numbers live here in :class:`Metrics`. Declarations,
and the one step every mode's round starts with (:func:`expire_stale`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

from peerd.daemon.config import Config
from peerd.daemon.participation import Participation
from peerd.learn.tasks import Task
from peerd.node.state import NodeState
from peerd.store.statedir import StateDir


@dataclass
class Metrics:
    """The last round's numbers, as ``peerd status`` reports them."""

    round: int = 0
    version: int = 0
    examples: int = 0
    train_loss: float = math.nan
    val_loss: float = math.nan
    val_accuracy: float | None = None
    alpha: dict[str, float] = field(default_factory=dict)
    drift: dict[str, float] = field(default_factory=dict)
    #: The last blend's weights after the robust rule (RoundOutput.weights); None: plan α.
    weights: dict[str, float] | None = None
    published_params: Mapping[str, torch.Tensor] | None = None


class ModeHost(Protocol):
    """The daemon as both round modes see it."""

    cfg: Config
    task: Task
    model: nn.Module
    node: NodeState
    metrics: Metrics
    state: StateDir
    participation: Participation
    now: Callable[[], float]


def expire_stale(host: ModeHost, node: NodeState, now: float) -> None:
    """Drop ``node``'s entries older than τ_max, each written to the audit log and counted
    as expired in the round's participation record (every mode's first step of a round);
    likewise the entries withdrawn since the last round, or now, because their origin was
    flagged or left the manifest (:meth:`NodeState.withdraw`): none of them is blended."""
    for item in node.expire(now):
        host.state.audit("expired", origin=item.meta.origin, version=item.meta.version)
        host.participation.expired(item.meta.origin, item.meta.version)
    for gone in node.withdraw(now):
        host.state.audit("withdrawn", origin=gone.origin, version=gone.version,
                         reason=str(gone.reason))
        host.participation.withdrawn(gone.origin, gone.version, str(gone.reason))
