"""What a learning mode is to the daemon, and the one round every mode runs.

A mode (``[learning] mode``, :class:`peerd.core.modes.ModeName`) owns what differs between
Cached-DFL, FedCache and cordial learning: the node state it gossips (models, or typed
entries under its schema), its local step, what it publishes, its learner file, the line it
logs and its status block. Everything else about a round is the same for all of them and
exists once, here, in :func:`run_round`: expire what aged out or was withdrawn, the mode's
step off the event loop, the round's numbers, the next version (never one a peer relayed
back), the counters persisted before anything is signed, the mode's publication, its
learner file, the participation audit, the log line, sd_notify's status and the release of
freed memory.

The registry of modes is :mod:`peerd.daemon.modes`; a mode is built from the daemon as the
:class:`~peerd.daemon.host.ModeHost` it sees (the daemon imports the modes, not the other
way round).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.control.status import ViewsStatus
from peerd.core.modes import ModeName
from peerd.daemon import sdnotify
from peerd.daemon.host import ModeHost, expire_stale
from peerd.daemon.memory import release_freed_memory
from peerd.learn import learnerstate
from peerd.node.peers import PeerTable
from peerd.node.state import Held, NodeState
from peerd.store.statedir import Counters

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Step:
    """What a mode's local step gives the round: its numbers and whether to publish."""

    examples: int
    train_loss: float
    val_loss: float
    val_accuracy: float | None
    publish: bool
    #: The blend plan's α and each peer model's drift after training (weight mode only).
    alpha: Mapping[str, float] = field(default_factory=dict)
    drift: Mapping[str, float] = field(default_factory=dict)
    #: The blend's weights after the robust rule (weight mode; None: the plan's α).
    weights: Mapping[str, float] | None = None


class ModeDaemon(ModeHost, Protocol):
    """The daemon as every mode together sees it (each declares what it reads of it)."""

    key: Ed25519PrivateKey
    peers: PeerTable


class Mode(Protocol):
    """One learning mode of one daemon (built by its entry in :data:`peerd.daemon.modes.MODES`)."""

    # Read-only members (properties), so that a mode may declare narrower types.
    @property
    def name(self) -> ModeName: ...

    @property
    def node(self) -> NodeState:
        """The node state this mode gossips: the daemon's NodeState, or a typed one over it."""

    @property
    def learner(self) -> learnerstate.Learner | None:
        """Saved after every round, restored at start-up (peerd.learn.learnerstate); None
        where the published entry is the learner's whole state (weight mode)."""

    def restore_own(self, own: Held) -> None:
        """The own entry came back from disk at start-up (before the first round)."""

    async def step(self, now: float) -> Step:
        """The local step, its training in a worker thread: every mode-specific part of the
        round before the round number moves on."""

    def versions(self) -> int:
        """How many versions the next publication signs (consecutive, from the next one)."""

    async def publish(self, version: int, now: float) -> None:
        """Sign this round's entries under ``version`` onwards (the counters already cover
        them) and make them the node's own."""

    def audit(self, round_no: int, published: int | None) -> None:
        """This round's participation record (peerd.daemon.participation)."""

    def summary(self) -> str:
        """The round's log line after ``round N: version V, ``."""

    def notify_detail(self) -> str:
        """sd_notify's STATUS after ``round N, version V, ``."""

    def status_block(self, now: float) -> ViewsStatus | None:
        """The mode's own block in ``peerd status`` (cordial: the views), else None."""


async def run_round(host: ModeHost, mode: Mode) -> bool:
    """One round of ``mode`` on ``host``; True when it published (the daemon then wakes the
    gossip)."""
    node, m, state = mode.node, host.metrics, host.state
    now = host.now()
    expire_stale(host, node, now)
    step = await mode.step(now)
    m.examples, m.train_loss, m.val_loss = step.examples, step.train_loss, step.val_loss
    m.val_accuracy, m.weights = step.val_accuracy, _copy(step.weights)
    m.alpha, m.drift = dict(step.alpha), dict(step.drift)
    node.round += 1
    if step.publish:
        # Never reuse a version: skip past anything of ours a peer relayed back, and
        # persist the counter (covering every version this publication signs) before an
        # entry can leave this process.
        version = max(m.version, node.own_max_version_seen) + 1
        last = version + mode.versions() - 1
        state.save_counters(Counters(round=node.round, version=last))
        await mode.publish(version, now)
        m.version = last
    else:
        state.save_counters(Counters(round=node.round, version=m.version))
    if mode.learner is not None:
        await trio.to_thread.run_sync(learnerstate.save, state, mode.learner, node.round)
    m.round = node.round
    mode.audit(node.round, m.version if step.publish else None)
    log.info("round %d: version %d, %s", node.round, m.version, mode.summary())
    release_freed_memory()
    sdnotify.status(f"round {node.round}, version {m.version}, {mode.notify_detail()}")
    return step.publish


def _copy(weights: Mapping[str, float] | None) -> dict[str, float] | None:
    return None if weights is None else dict(weights)


def val_accuracy_text(acc: float | None) -> str:
    """How a round's log line shows the validation accuracy ("-" when there is none)."""
    return "-" if acc is None else f"{acc:.3f}"
