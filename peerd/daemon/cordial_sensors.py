"""``[learning] mode = "sensors"``: cordial agents on time buckets.

Wiring only, like :mod:`peerd.daemon.cordial` (whose agent groups, view publication and
Daemon protocol it shares): the gossip state is a
:class:`peerd.node.knowstate.KnowledgeState` under this fleet's view schema, the training
:class:`peerd.learn.sensorround.SensorLearner`. The agent is ``[task] node_index`` of
``node_count``; ``[task] seed`` seeds the fleet-wide problem and every bucket's draw. Each
round: drop stale views; take the current bucket ⌊now / bucket_s⌋ ([learning.cordial]) and
the ones missed since the last round into the window; train on the freshest view of every peer
agent that the manifest binds and the view bound and round guard admit (peerd.daemon.cordial);
publish h_i for every bucket of the window (ids k mod 65,536, sorted) under the node's next version;
save the learner (peerd.learn.learnerstate), which the next start restores.
"""

from __future__ import annotations

import logging
import math

import trio

from peerd.control.status import ViewRow, ViewsStatus
from peerd.core.timebuckets import VIEW_IDS, bucket_of
from peerd.daemon import sdnotify
from peerd.daemon.cordial import (
    Daemon,
    ViewGate,
    agent_group,
    agent_of,
    bind_views,
    publish_view,
)
from peerd.daemon.host import expire_stale
from peerd.learn import learnerstate, viewguard
from peerd.learn.cordialround import PeerView
from peerd.learn.linearproblem import M_OUT
from peerd.learn.sensorround import SensorLearner, SensorRoundOutput
from peerd.learn.sensors import SensorFleet
from peerd.node.knowstate import KnowledgeState
from peerd.protocol.knowledge import KnowledgeSchema

log = logging.getLogger(__name__)


def sensor_view_schema(agents: int, bucket_s: float, window: int, seed: int
                       ) -> KnowledgeSchema:
    """What every node of a sensor fleet must agree on: the problem (agents, seed), the
    buckets (their width, the window's rows) and the ring of ids. A regression has no
    classes: ``num_classes`` is the least a schema names, fixed for the task."""
    return KnowledgeSchema(key_dim=M_OUT, num_classes=2, max_samples=window, view_ids=VIEW_IDS,
                           encoder=f"cordial-sensors/v1 agents={agents} bucket_s={bucket_s!r} "
                                   f"window={window} seed={seed}")


def _nan_none(v: float) -> float | None:
    return None if math.isnan(v) else v


class SensorMode:
    """The sensor half of one daemon: its view state, its agent and what status shows."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        learning, task = daemon.cfg.learning, daemon.cfg.task
        self.index, self.agents = task.node_index, task.node_count
        self.bucket_s = learning.cordial.bucket_s
        self.schema = sensor_view_schema(self.agents, self.bucket_s, learning.cordial.window,
                                         task.seed)
        self.node = KnowledgeState.from_node(daemon.node, self.schema,
                                             sample_budget=learning.sample_capacity)
        self.node.group = agent_group(self.index)
        bind_views(self.node, self.index)  # only the member an agent is speaks for it
        self.gate = ViewGate(self.node, self.index, self.agents)
        self.learner = SensorLearner(
            SensorFleet(self.agents, task.seed), self.index, window=learning.cordial.window,
            coordination=learning.cordial.coordination, batch_size=learning.batch_size,
            steps=learning.local_steps, bucket_s=self.bucket_s)
        learnerstate.restore(daemon.state, self.learner)
        self.last: SensorRoundOutput | None = None
        self._used: dict[int, str] = {}  # agent -> the origin whose view the last round used

    def peer_views(self) -> list[PeerView]:
        """The freshest usable view of every peer agent (peerd.daemon.cordial.ViewGate)."""
        return [PeerView(agent, v.ids, v.vectors) for agent, v in self.gate.select()]

    def status(self, now: float) -> ViewsStatus:
        """Which peers' views are held and how many of the window's buckets each covers."""
        window = {b % VIEW_IDS for b in self.learner.buckets}
        rows = []
        for v in self.node.views():
            agent = agent_of(v.group)
            rows.append(ViewRow(origin=v.origin, agent=agent, version=v.version,
                                age_s=now - v.created_at,
                                ids=sum(int(i) in window for i in v.ids),
                                used=agent is not None and self._used.get(agent) == v.origin))
        last = self.last
        return ViewsStatus(
            agent=self.index, agents=self.agents, ids=len(window),
            coordination=self.learner.coordination, epoch=float(self.learner.iterations),
            test_accuracy=None, test_loss=None if last is None else _nan_none(last.val_loss),
            peers=tuple(rows))

    async def round(self) -> None:
        d, node = self.daemon, self.node
        now = d.now()
        expire_stale(d, node, now)
        views = self.peer_views()
        held = {v.origin: (v.version, v.created_at, agent_of(v.group)) for v in node.views()}
        clock = node.clock(now)
        bucket = bucket_of(now, self.bucket_s)
        learner = self.learner

        def train() -> tuple[SensorRoundOutput, list[int]]:
            learner.observe(bucket)  # first: the guard's loss before the round is on this window
            return viewguard.guarded_round(learner, lambda vs: learner.round(bucket, vs), views)

        out, refused = await trio.to_thread.run_sync(train)
        self.gate.refuse(refused)
        self.last = out
        self._used = {}
        for origin, (_, _, agent) in held.items():  # freshest first, as views() gave them
            if agent is not None and out.coverage.get(agent) and agent not in self._used:
                self._used[agent] = origin
        m = d.metrics
        m.examples, m.train_loss, m.val_loss = len(out.ids), out.train_loss, out.val_loss
        m.val_accuracy, m.alpha, m.drift = None, {}, {}
        node.round += 1
        await publish_view(d, node, self.schema, out.ids, out.views)
        await trio.to_thread.run_sync(learnerstate.save, d.state, self.learner, node.round)
        m.round = node.round
        used_origins = set(self._used.values())
        d.participation.knowledge_round(
            round_no=node.round, own_id=node.id, clock=clock, published=m.version,
            used=[(o, ver, at) for o, (ver, at, _) in held.items() if o in used_origins])
        log.info("round %d: version %d, bucket %d, %d iterations, loss %.4f, held-out loss "
                 "%.4f on %d buckets, views of %d/%d peer agents", node.round, m.version,
                 bucket, out.iterations, out.train_loss, out.val_loss, out.held_out,
                 sum(1 for c in out.coverage.values() if c), self.agents - 1)
        sdnotify.status(f"round {node.round}, version {m.version}, bucket {bucket}")


def attach(daemon: Daemon) -> SensorMode:
    """Switch a daemon built for weights to cordial mode on sensors (as
    :func:`peerd.daemon.cordial.attach`)."""
    mode = SensorMode(daemon)
    daemon.node = mode.node
    return mode
