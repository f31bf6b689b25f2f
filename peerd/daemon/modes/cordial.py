"""``[learning] mode = "cordial"``: one Pairwise-10 agent per daemon, views between them.

Wiring only, like :mod:`peerd.daemon.modes.knowledge` (the round around the step is
:func:`peerd.daemon.modes.base.run_round`'s). The gossip state is
:class:`peerd.node.knowstate.KnowledgeState` under a **view schema** (peerd.protocol.knowledge:
views are knowledge entries of another layout, with the same ledger, τ_max and capacities),
the training :class:`peerd.learn.cordialround.CordialLearner`.

The agent is ``[task] node_index`` of ``node_count``; ``[task] seed`` seeds the shared index,
so every node draws the same composites and keeps its own digit. The node signs its views
in cache group ``agent-<index>``, which tells receivers whose Λ_j^i a view feeds. That label
is the sender's choice, so a view is held only if the fleet manifest binds its origin to the
agent it names (:func:`view_refusal`, issue 24: any member could otherwise speak for any
agent), and used only if it is not far larger than that agent's recent views
(:class:`peerd.core.viewbound.ViewBound`) and training on it does not blow the loss up
(:func:`peerd.learn.viewguard.guarded_round`: the round runs again without it). Each round:
drop stale views; train K steps on the freshest view of every peer agent; publish this
round's h_i for every id of the index under the node's next version; save the agent as the
learner file (peerd.learn.learnerstate), which the next start restores.
"""

from __future__ import annotations

import logging
import re
from typing import Protocol

import numpy as np
import numpy.typing as npt
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.control.status import ViewRow, ViewsStatus
from peerd.core.entry import EntryMeta
from peerd.core.modes import ModeName
from peerd.core.reasons import Reason
from peerd.core.staleness import Clock
from peerd.core.viewbound import ViewBound, view_scale
from peerd.daemon.host import ModeHost
from peerd.daemon.modes.base import Step
from peerd.learn import learnerstate, viewguard
from peerd.learn.cordialround import (
    WIDTH,
    CordialLearner,
    CordialRoundOutput,
    PeerView,
    agent_data,
    index_size,
)
from peerd.node.knowstate import KnowledgeState, TypedHeld, ViewRows, sign_own_view
from peerd.node.state import Held
from peerd.protocol.knowledge import KnowledgeSchema
from peerd.protocol.manifest import Manifest

log = logging.getLogger(__name__)

_AGENT = re.compile(r"agent-(\d{1,4})")


class Daemon(ModeHost, Protocol):
    """What cordial mode uses of :class:`peerd.daemon.daemon.Daemon` (see
    :mod:`peerd.daemon.host`)."""

    key: Ed25519PrivateKey


def agent_group(index: int) -> str:
    """The cache group a cordial node signs its views in."""
    return f"agent-{index}"


def agent_of(group: str | None) -> int | None:
    """The agent a view's signed group names; None when it names none."""
    m = _AGENT.fullmatch(group or "")
    return None if m is None else int(m.group(1))


def view_refusal(manifest: Manifest, meta: EntryMeta) -> Reason | None:
    """Why a view may not be held as the agent its group names: AGENT_NOT_BOUND unless the
    manifest binds its origin to exactly that agent (the admin's word, not the sender's)."""
    agent = agent_of(meta.group)
    if agent is None or manifest.agent_of(meta.origin) != agent:
        return Reason.AGENT_NOT_BOUND
    return None


def bind_views(node: KnowledgeState, index: int) -> None:
    """Hold only views the manifest backs; say once at start-up when it backs none."""
    node.check_views(view_refusal)
    manifest = node.manifest
    if not manifest.binds_agents:
        log.warning("the fleet manifest binds no member to a cordial agent: every peer view "
                    "is refused (%s); admit each node with `peerd fleet admit --agent N`",
                    Reason.AGENT_NOT_BOUND)
    elif manifest.agent_of(node.id) != index:
        log.warning("the fleet manifest does not bind this node to agent %d: peers refuse "
                    "its views (%s); admit it with `peerd fleet admit --agent %d`", index,
                    Reason.AGENT_NOT_BOUND, index)


class ViewGate:
    """Which held views a round may use: one per peer agent, the freshest whose origin the
    manifest (still) binds to it and whose size :class:`ViewBound` admits; a view too large
    is dropped from the cache (counted as VIEW_TOO_LARGE) and logged."""

    def __init__(self, node: KnowledgeState, index: int, agents: int) -> None:
        self.node, self.index, self.agents = node, index, agents
        self.bound = ViewBound()
        #: agent -> the origin of the view the last select() gave for it
        self.origins: dict[int, str] = {}

    def refuse(self, agents: list[int]) -> None:
        """Drop the views the last round ran again without (peerd.learn.viewguard)."""
        for agent in agents:
            origin = self.origins.get(agent)
            if origin is None:
                continue
            seen = self.bound.history.get(agent)
            if seen:  # it entered the size history this round: it must not move the bound
                seen.pop()
            log.warning("refused agent %d's view from %s: training on it raised the loss by "
                        "orders of magnitude; the round ran again without it (%s)", agent,
                        origin, Reason.VIEW_RAISES_LOSS)
            self.node.drop(origin, Reason.VIEW_RAISES_LOSS)

    def select(self) -> list[tuple[int, ViewRows]]:
        node = self.node
        own = node.own
        own_scale = 0.0  # no own view yet: the bound's floor
        if isinstance(own, TypedHeld) and "vectors" in own.arrays:
            own_scale = view_scale(np.asarray(own.arrays["vectors"], dtype=np.float32))
        out: list[tuple[int, ViewRows]] = []
        for v in node.views():  # freshest first
            agent = agent_of(v.group)
            if agent is None or agent == self.index or agent >= self.agents \
                    or any(a == agent for a, _ in out) \
                    or node.manifest.agent_of(v.origin) != agent:
                continue
            scale = view_scale(v.vectors)
            if not self.bound.admit(agent, scale, own_scale):
                log.warning("refused agent %d's view from %s (version %d): largest row norm "
                            "%.3g above the bound %.3g (%s)", agent, v.origin, v.version,
                            scale, self.bound.bound(agent, own_scale), Reason.VIEW_TOO_LARGE)
                node.drop(v.origin, Reason.VIEW_TOO_LARGE)
                continue
            out.append((agent, v))
        self.origins = {agent: v.origin for agent, v in out}
        return out


def view_schema(agents: int, per_digit: int, seed: int,
                source: str = "mnist") -> KnowledgeSchema:
    """What every node of a cordial fleet must agree on: the task, its shared index (agents,
    P, seed, the images the composites are drawn from) and the vectors' width."""
    size = index_size(per_digit)
    # MNIST's encoder string predates the digits source and stays as it was (its schema id is
    # pinned, tests/protocol); a digits fleet's differs, so the two never mix views.
    data = "" if source == "mnist" else f" data={source}"
    return KnowledgeSchema(key_dim=WIDTH, num_classes=10, max_samples=size, view_ids=size,
                           encoder=f"cordial-pairwise10/v1 agents={agents} p={per_digit} "
                                   f"seed={seed}{data}")


class CordialMode:
    """The cordial half of one daemon: its view state, its agent and what status shows."""

    name = ModeName.CORDIAL

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        cfg = daemon.cfg
        learning, task = cfg.learning, cfg.task
        self.index, self.agents = task.node_index, task.node_count
        # [task] name is the composites' images: "mnist" or "digits" (config_learning checks).
        self.data = agent_data(self.agents, self.index, learning.cordial.images_per_digit,
                               task.seed, source=task.name)
        self.schema = view_schema(self.agents, learning.cordial.images_per_digit, task.seed,
                                  task.name)
        self.node = KnowledgeState.from_node(daemon.node, self.schema,
                                             sample_budget=learning.sample_capacity)
        self.node.group = agent_group(self.index)
        bind_views(self.node, self.index)
        self.gate = ViewGate(self.node, self.index, self.agents)
        self.learner = CordialLearner(
            self.data, coordination=learning.cordial.coordination,
            warmup_epochs=learning.cordial.warmup_epochs, batch_size=learning.batch_size,
            steps=learning.local_steps, seed=task.seed)
        # The agent (M_i, Λ_j^i, Adam's moments, the schedules' step count, its random stream)
        # survives a restart: the learner file, saved every round.
        learnerstate.restore(daemon.state, self.learner)
        self.last: CordialRoundOutput | None = None
        self._used: dict[int, tuple[str, int, int]] = {}  # agent -> (origin, version, ids)
        self._held: dict[str, tuple[int, float]] = {}  # origin -> (version, created_at)
        self._clock: Clock | None = None

    def peer_views(self) -> list[PeerView]:
        """The freshest usable view of every peer agent (:class:`ViewGate`)."""
        return [PeerView(agent, v.ids, v.vectors) for agent, v in self.gate.select()]

    def status(self, now: float) -> ViewsStatus:
        """Which peers' views are held and how many of the current ids each covers."""
        size = self.data.size
        rows = []
        for v in self.node.views():
            agent = agent_of(v.group)
            rows.append(ViewRow(origin=v.origin, agent=agent, version=v.version,
                                age_s=now - v.created_at,
                                ids=int(np.count_nonzero(v.ids < size)),
                                used=agent is not None and
                                self._used.get(agent, ("",))[0] == v.origin))
        last = self.last
        return ViewsStatus(
            agent=self.index, agents=self.agents, ids=size,
            coordination=self.daemon.cfg.learning.cordial.coordination,
            epoch=self.learner.epoch,
            test_accuracy=None if last is None else last.test_accuracy,
            test_loss=None if last is None else last.test_loss, peers=tuple(rows))

    def restore_own(self, own: Held) -> None:
        return None  # its views are not kept across restarts: the learner file is

    async def step(self, now: float) -> Step:
        node = self.node
        views = self.peer_views()
        used = {v.origin: (v.version, v.created_at) for v in node.views()}
        learner = self.learner
        out, refused = await trio.to_thread.run_sync(
            lambda: viewguard.guarded_round(learner, learner.round, views))
        self.gate.refuse(refused)
        self.last = out
        self._used = {}
        for v in node.views():
            agent = agent_of(v.group)
            if agent is not None and agent in out.coverage and agent not in self._used:
                self._used[agent] = (v.origin, v.version, out.coverage[agent])
        self._held, self._clock = used, node.clock(now)
        return Step(examples=len(self.data.y["train"]), train_loss=out.train_loss,
                    val_loss=out.val_loss, val_accuracy=out.val_accuracy, publish=True)

    def versions(self) -> int:
        return 1

    async def publish(self, version: int, now: float) -> None:
        """This round's h_i for every id, under ``version``."""
        assert self.last is not None
        await publish_view(self.daemon, self.node, self.schema,
                           np.arange(self.data.size, dtype=np.int32), self.last.views, version)

    def audit(self, round_no: int, published: int | None) -> None:
        assert self._clock is not None
        used = self._held
        self.daemon.participation.typed_round(
            mode=self.name, round_no=round_no, own_id=self.node.id, clock=self._clock,
            published=published,
            used=[(o, ver, at) for o, (ver, at) in used.items()
                  if any(u[0] == o for u in self._used.values())])

    def summary(self) -> str:
        out = self.last
        assert out is not None
        return (f"epoch {out.epoch:.1f}, loss {out.train_loss:.4f}, val acc "
                f"{out.val_accuracy:.3f}, test acc {out.test_accuracy:.3f}, views of "
                f"{len(out.coverage)}/{self.agents - 1} peer agents")

    def notify_detail(self) -> str:
        assert self.last is not None
        return f"{len(self.last.coverage)} views"

    def status_block(self, now: float) -> ViewsStatus | None:
        return self.status(now)


async def publish_view(d: Daemon, node: KnowledgeState, schema: KnowledgeSchema,
                       ids: npt.NDArray[np.int32], vectors: npt.NDArray[np.float32],
                       version: int) -> None:
    """Sign ``vectors`` for ``ids`` as the node's view under ``version`` (the round has
    persisted the counters) and make it the own entry."""
    key, fleet = d.key, d.cfg.fleet.fleet_id
    held = await trio.to_thread.run_sync(lambda: sign_own_view(
        key, fleet, schema, version=version, created_at=d.now(), ids=ids, vectors=vectors,
        group=node.group))
    node.set_own(held.entry, held.message)
    node.own = held  # the typed holding (set_own recorded the version in the ledger)
