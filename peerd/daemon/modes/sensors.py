"""``[learning] mode = "sensors"``: cordial agents on time buckets.

Wiring only, like :mod:`peerd.daemon.modes.cordial` (whose agent groups, view publication and
Daemon protocol it shares): the gossip state is a
:class:`peerd.node.knowstate.KnowledgeState` under this fleet's view schema, the training
:class:`peerd.learn.sensorround.SensorLearner`. The agent is ``[task] node_index`` of
``node_count``; ``[task] seed`` seeds the fleet-wide problem and every bucket's draw. Each
round: drop stale views; take the current bucket ⌊now / bucket_s⌋ ([learning.cordial]) and
the ones missed since the last round into the window; train on the freshest view of every peer
agent that the manifest binds and the view bound and round guard admit
(peerd.daemon.modes.cordial); publish h_i for every bucket of the window (ids k mod 65,536,
sorted) under the node's next version;
save the learner (peerd.learn.learnerstate), which the next start restores.
"""

from __future__ import annotations

import logging
import math

import trio

from peerd.control.status import ViewRow, ViewsStatus
from peerd.core.modes import ModeName
from peerd.core.staleness import Clock
from peerd.core.timebuckets import VIEW_IDS, bucket_of
from peerd.daemon.modes.base import Step
from peerd.daemon.modes.cordial import (
    Daemon,
    ViewGate,
    agent_group,
    agent_of,
    bind_views,
    publish_view,
)
from peerd.learn import learnerstate, viewguard
from peerd.learn.cordialround import PeerView
from peerd.learn.linearproblem import M_OUT
from peerd.learn.sensorround import SensorLearner, SensorRoundOutput
from peerd.learn.sensors import SensorFleet
from peerd.node.knowstate import KnowledgeState
from peerd.node.state import Held
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

    name = ModeName.SENSORS

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
        #: origin -> (version, created_at, agent) of the views held when the round began
        self._held: dict[str, tuple[int, float, int | None]] = {}
        self._clock: Clock | None = None
        self._bucket = 0

    def peer_views(self) -> list[PeerView]:
        """The freshest usable view of every peer agent (peerd.daemon.modes.cordial.ViewGate)."""
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

    def restore_own(self, own: Held) -> None:
        return None  # its views are not kept across restarts: the learner file is

    async def step(self, now: float) -> Step:
        node = self.node
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
        self._held, self._clock, self._bucket = held, clock, bucket
        return Step(examples=len(out.ids), train_loss=out.train_loss, val_loss=out.val_loss,
                    val_accuracy=None, publish=True)

    def versions(self) -> int:
        return 1

    async def publish(self, version: int, now: float) -> None:
        assert self.last is not None
        await publish_view(self.daemon, self.node, self.schema, self.last.ids, self.last.views,
                           version)

    def audit(self, round_no: int, published: int | None) -> None:
        assert self._clock is not None
        used_origins = set(self._used.values())
        self.daemon.participation.typed_round(
            mode=self.name, round_no=round_no, own_id=self.node.id, clock=self._clock,
            published=published,
            used=[(o, ver, at) for o, (ver, at, _) in self._held.items() if o in used_origins])

    def summary(self) -> str:
        out = self.last
        assert out is not None
        return (f"bucket {self._bucket}, {out.iterations} iterations, loss "
                f"{out.train_loss:.4f}, held-out loss {out.val_loss:.4f} on {out.held_out} "
                f"buckets, views of {sum(1 for c in out.coverage.values() if c)}/"
                f"{self.agents - 1} peer agents")

    def notify_detail(self) -> str:
        return f"bucket {self._bucket}"

    def status_block(self, now: float) -> ViewsStatus | None:
        return self.status(now)
