"""A gossip-scale simulator of the real code: N nodes in one process on a simulated clock.

Each node is the daemon's gossip machinery without its sockets: a real
:class:`peerd.node.state.NodeState` (its ledger, Want merge and cache merge), a real
:class:`peerd.node.peers.PeerTable` swept with the configured ``fanout``, a real
:class:`peerd.node.inflight.InFlight`, and sessions run by the real
:func:`peerd.net.gossip.run_session` over in-memory links (:mod:`peerd.sim.gossiplink`) under
``trio.testing.MockClock`` (autojump: hours of gossip take seconds). What the daemon's
``_gossip_loop`` / ``_dial`` / ``_inbound`` / ``_session`` do around a session is mirrored
here: sweeps every ``GOSSIP_INTERVAL_S`` × U(0.5, 1.5), a sweep at once after a publish,
inbound sessions capped (a busy node resets the stream, the dialler backs off), the outcome
reported to the peer table. Entries are real signed Ed25519 entries of a two-float model.

The workload: the fleet starts converged (every node holds its own entry and the C freshest
of the others'), then ``probes`` times a random live node publishes a new version, the
freshest in the fleet, so every node would keep it; the run measures how many intervals pass
until 50 / 95 / 99 / 100 % of the live nodes other than its origin hold it. Loss cuts a
session after a random number of frames; churn takes nodes offline (no sessions, dials to
them fail) and back, state kept (a laptop asleep). The simulator builds the member list
directly and never signs or sends it (a real fleet of up to ``MAX_MEMBERS``, 1,024, can).
One seed gives one run, in any process (:func:`peerd.sim.gossiplink.sim_runtime`).

It imports no transport, discovery or daemon code; the daemon's constants it mirrors are
checked against the daemon's in tests/sim/test_gossipsim.py.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
import trio
import trio.testing

from peerd.core.entry import Schema
from peerd.core.limits import ValidationLimits
from peerd.core.reasons import Reason
from peerd.net.gossip import ReceiveSlots, SessionContext, SessionResult, run_session
from peerd.node.inflight import InFlight
from peerd.node.peers import DEFAULT_FANOUT, PEER_FORGET_S, Peer, PeerTable
from peerd.node.state import Held, NodeState, sign_own
from peerd.protocol.identity import node_id_of, private_key_from_seed, public_key_bytes
from peerd.protocol.manifest import Manifest, Member
from peerd.sim.gossiplink import Link, LinkCutError, sim_runtime

#: The daemon's values (peerd.daemon.daemon, peerd.daemon.config defaults).
GOSSIP_INTERVAL_S = 3.0
SESSION_TIMEOUT_S = 300.0
MAX_INBOUND_SESSIONS = 8
CAPACITY = 10
FLEET = hashlib.sha256(b"peerd gossip simulator").digest()[:16]
#: Simulated time 0 on the nodes' clock (any time will do; signatures carry it).
EPOCH = 1_800_000_000.0
#: Reasons an entry that crossed the link was refused for being already held.
DUPLICATE = frozenset({str(Reason.NOT_NEWER), str(Reason.OWN_ORIGIN)})
THRESHOLDS = (0.5, 0.95, 0.99, 1.0)
#: Where in the interval churn and mDNS refreshes happen (irrational: never at a probe's
#: or at each other's instant). trio expires equal deadlines in the order of the cancel
#: scopes' memory addresses, so two timers due at one simulated instant would make runs
#: with one seed differ.
CHURN_PHASE = math.sqrt(2) - 1
MDNS_PHASE = math.sqrt(3) - 1
SCHEMA = Schema.of({"w": torch.zeros(2)})


@dataclass(frozen=True)
class GossipSimConfig:
    nodes: int
    #: Sessions a node starts per sweep; None: every due peer (the daemon before issue 14).
    fanout: int | None = DEFAULT_FANOUT
    probes: int = 5
    capacity: int = CAPACITY
    #: Probability that a session is cut after a random number of its frames.
    loss: float = 0.0
    #: Fraction of the nodes offline at any moment; each stays away ``downtime`` intervals
    #: on average.
    churn: float = 0.0
    downtime: float = 10.0
    #: Mean one-way latency per link (each link draws U(0.5, 1.5) × it); a dial costs a
    #: round trip (the Noise handshake) before the session.
    latency_s: float = 0.0
    inflight: bool = True
    max_inbound: int = MAX_INBOUND_SESSIONS
    interval_s: float = GOSSIP_INTERVAL_S
    seed: int = 0
    #: A probe is given up after this many intervals (default 4·log2(N) + 20).
    max_probe_intervals: float | None = None
    #: Intervals between one probe's end and the next publish.
    gap_intervals: float = 1.0


@dataclass
class Probe:
    origin: str
    version: int
    published_at: float  # simulated seconds
    #: Intervals after publishing at which each THRESHOLDS fraction was first reached.
    reached: dict[float, float] = field(default_factory=dict)
    #: (intervals after publishing, fraction of the live nodes holding it) at each change.
    curve: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class GossipSimResult:
    config: GossipSimConfig
    probes: list[Probe] = field(default_factory=list)
    intervals: float = 0.0  # simulated run length
    started: int = 0  # sessions reserved by sweeps (dial attempts)
    completed: int = 0  # sessions both sides ran to the end
    lost: int = 0  # cut by loss or churn
    unreachable: int = 0  # dialled an offline node
    busy: int = 0  # refused by the inbound cap
    timeouts: int = 0
    bytes_sent: int = 0  # frames with their length prefix, all nodes
    entries_sent: int = 0
    entries_accepted: int = 0
    duplicates: int = 0  # entries received and refused as already held
    refused: Counter[str] = field(default_factory=Counter)
    deduplicated: int = 0  # Want items InFlight left out (duplicate transfers saved)
    max_per_sweep: int = 0  # most sessions one node started in one sweep
    max_inbound_seen: int = 0  # most inbound sessions one node ran at once
    max_outbound_seen: int = 0  # most of its own sessions one node ran at once (≤ fanout)
    wall_s: float = 0.0

    def per_node_interval(self, total: int) -> float:
        return total / (self.config.nodes * self.intervals) if self.intervals else 0.0

    def reach(self, fraction: float) -> float | None:
        """Mean intervals until ``fraction`` was reached; None if some probe never did."""
        times = [p.reached.get(fraction) for p in self.probes]
        if not times or any(t is None for t in times):
            return None
        return sum(t for t in times if t is not None) / len(times)

    def reach_max(self, fraction: float) -> float | None:
        times = [p.reached.get(fraction) for p in self.probes]
        if not times or any(t is None for t in times):
            return None
        return max(t for t in times if t is not None)


class SimNodeState(NodeState):
    """A NodeState that tells the simulator which entries it kept, and when."""

    sim: GossipSim | None = None

    def accept(self, verified: Held, *, sender: str, now: float) -> Reason | None:
        reason = super().accept(verified, sender=sender, now=now)
        if reason is None and self.sim is not None:
            self.sim.kept(self, verified.entry.meta.origin, verified.entry.meta.version)
        return reason


@dataclass
class SimNode:
    state: SimNodeState
    peers: PeerTable
    ctx: SessionContext
    inflight: InFlight
    rng: random.Random
    up: bool = True
    inbound: int = 0
    outbound: int = 0
    wake: trio.Event = field(default_factory=trio.Event)

    @property
    def id(self) -> str:
        return self.state.id


def _publish(node: SimNode, version: int, created_at: float) -> Held:
    params = {"w": torch.tensor([float(version), float(len(node.id))])}
    entry, message = sign_own(node.state.key, FLEET, params=params, version=version,
                              created_at=created_at, num_examples=1)
    node.state.set_own(entry, message)
    assert node.state.own is not None
    return node.state.own


class GossipSim:
    """One run of :class:`GossipSimConfig`; :meth:`run` returns its result."""

    def __init__(self, cfg: GossipSimConfig) -> None:
        if cfg.nodes < 2:
            raise ValueError("a gossip simulation needs at least 2 nodes")
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.result = GossipSimResult(cfg)
        keys = [private_key_from_seed(hashlib.sha256(b"sim node %d" % i).digest())
                for i in range(cfg.nodes)]
        members = tuple(sorted((Member(node_id_of(k), public_key_bytes(k)) for k in keys),
                               key=lambda m: m.node_id))
        manifest = Manifest(FLEET, 1, members)
        self.nodes: dict[str, SimNode] = {}
        for i, k in enumerate(keys):
            state = SimNodeState(key=k, fleet_id=FLEET, manifest=manifest, schema=SCHEMA,
                                 limits=ValidationLimits(), tau_max=1e9,
                                 capacity=cfg.capacity)
            state.sim = self
            inflight = InFlight()
            ctx = SessionContext(admin_key=b"\0" * 32, now=self.now,
                                 receive_slots=ReceiveSlots(1), min_receive_rate_bps=0,
                                 inflight=inflight if cfg.inflight else None)
            rng = random.Random(f"{cfg.seed}/{i}")
            self.nodes[state.id] = SimNode(state, PeerTable(state.id, rng=rng), ctx,
                                           inflight, rng)
        self._probe: Probe | None = None
        self._holders: set[str] = set()
        self._latency: dict[tuple[str, str], float] = {}
        self._converge()

    # ------------------------------------------------------------------ set-up
    def _converge(self) -> None:
        """Every node publishes version 1 (at distinct past times) and holds the C freshest
        entries of the others, as after a long quiet period: no start-up flood."""
        own = [(_publish(n, 1, EPOCH - 1000.0 - i), n) for i, n in enumerate(self.nodes.values())]
        freshest = own[: self.cfg.capacity + 1]
        for node in self.nodes.values():
            for held, origin in freshest:
                if origin is not node:
                    node.state.accept(held, sender=origin.id, now=EPOCH)
            node.state.accepted = 0
        self._hint_all(0.0)

    def _hint_all(self, now: float) -> None:
        """mDNS: every live node learns (again) of every other live node."""
        live = [n.id for n in self.nodes.values() if n.up]
        for node in self.nodes.values():
            if node.up:
                for peer in live:
                    node.peers.on_hint(peer, ("/sim",), EPOCH + now)

    # ------------------------------------------------------------------ clock and hooks
    @staticmethod
    def now() -> float:
        return EPOCH + trio.current_time()

    def kept(self, state: SimNodeState, origin: str, version: int) -> None:
        probe = self._probe
        if probe is None or (origin, version) != (probe.origin, probe.version):
            return
        self._holders.add(state.id)
        self._record()

    def _record(self) -> None:
        probe = self._probe
        assert probe is not None
        live = [n for n in self.nodes.values() if n.up and n.id != probe.origin]
        held = sum(1 for n in live if n.id in self._holders)
        fraction = held / len(live) if live else 1.0
        t = (trio.current_time() - probe.published_at) / self.cfg.interval_s
        if not probe.curve or probe.curve[-1][1] != fraction:
            probe.curve.append((t, fraction))
        for x in THRESHOLDS:
            if fraction >= x and x not in probe.reached:
                probe.reached[x] = t

    def _link_latency(self, a: str, b: str) -> float:
        if self.cfg.latency_s <= 0:
            return 0.0
        pair = (a, b) if a < b else (b, a)
        if pair not in self._latency:
            self._latency[pair] = self.cfg.latency_s * self.rng.uniform(0.5, 1.5)
        return self._latency[pair]

    # ------------------------------------------------------------------ the run
    def run(self) -> GossipSimResult:
        t0 = time.perf_counter()
        with sim_runtime(self.cfg.seed):
            trio.run(self._main, clock=trio.testing.MockClock(autojump_threshold=0))
        self.result.wall_s = time.perf_counter() - t0
        self.result.deduplicated = sum(n.inflight.deduplicated for n in self.nodes.values())
        return self.result

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            for node in self.nodes.values():
                nursery.start_soon(self._gossip_loop, node, nursery)
            nursery.start_soon(self._mdns)
            if self.cfg.churn > 0:
                nursery.start_soon(self._churn)
            await self._probes()
            self.result.intervals = trio.current_time() / self.cfg.interval_s
            nursery.cancel_scope.cancel()

    async def _probes(self) -> None:
        cfg = self.cfg
        limit = cfg.max_probe_intervals or 4 * math.log2(cfg.nodes) + 20
        await trio.sleep(cfg.gap_intervals * cfg.interval_s)
        for _ in range(cfg.probes):
            origin = self.rng.choice([n for n in self.nodes.values() if n.up])
            version = origin.state.own_high_water() + 1
            now = trio.current_time()
            self._probe = Probe(origin.id, version, now)
            self._holders = set()
            _publish(origin, version, EPOCH + now)
            origin.wake.set()  # the daemon sweeps at once after a publish
            self._record()
            with trio.move_on_after(limit * cfg.interval_s):
                while 1.0 not in self._probe.reached:
                    await trio.sleep(cfg.interval_s / 20)
                    self._record()  # churn changes the fraction between receipts
            self.result.probes.append(self._probe)
            self._probe = None
            await trio.sleep(cfg.gap_intervals * cfg.interval_s)

    async def _mdns(self) -> None:
        await trio.sleep(self.cfg.interval_s * MDNS_PHASE)
        while True:  # records are refreshed well before PEER_FORGET_S drops a peer
            await trio.sleep(PEER_FORGET_S / 4)
            self._hint_all(trio.current_time())

    async def _churn(self) -> None:
        cfg = self.cfg
        back = 1.0 / cfg.downtime
        leave = cfg.churn * back / (1.0 - cfg.churn)  # steady state: churn of them away
        ids = sorted(self.nodes)
        for node_id in self.rng.sample(ids, round(cfg.churn * len(ids))):
            self.nodes[node_id].up = False
        await trio.sleep(cfg.interval_s * CHURN_PHASE)
        while True:
            await trio.sleep(cfg.interval_s)
            for node_id in ids:
                node = self.nodes[node_id]
                if self.rng.random() < (leave if node.up else back):
                    node.up = not node.up

    async def _gossip_loop(self, node: SimNode, nursery: trio.Nursery) -> None:
        cfg = self.cfg
        await trio.sleep(node.rng.uniform(0, cfg.interval_s))  # nodes did not start together
        while True:
            if node.up:
                # The daemon's rule: at most `fanout` own sessions at once, so a slow
                # session holds a slot and a wake-up cannot pile sweeps onto each other.
                free = None if cfg.fanout is None else max(cfg.fanout - node.outbound, 0)
                due = node.peers.due(self.now(), fanout=free)
                self.result.started += len(due)
                self.result.max_per_sweep = max(self.result.max_per_sweep, len(due))
                for peer in due:
                    nursery.start_soon(self._dial, node, peer)
            with trio.move_on_after(cfg.interval_s * node.rng.uniform(0.5, 1.5)):
                await node.wake.wait()
            node.wake = trio.Event()

    async def _dial(self, a: SimNode, peer: Peer) -> None:
        r = self.result
        b = self.nodes[peer.id]
        latency = self._link_latency(a.id, b.id)
        a.outbound += 1
        r.max_outbound_seen = max(r.max_outbound_seen, a.outbound)
        try:
            await trio.sleep(2 * latency)  # the connection's handshake
            if not (a.up and b.up):
                r.unreachable += 1
                a.peers.failed(peer, "unreachable", self.now())
                return
            if b.inbound >= self.cfg.max_inbound:  # the daemon's _inbound: reset the stream
                r.busy += 1
                a.peers.failed(peer, "busy", self.now())
                return
            b.inbound += 1
            r.max_inbound_seen = max(r.max_inbound_seen, b.inbound)
            try:
                await self._session(a, b, peer, latency)
            finally:
                b.inbound -= 1
        finally:
            a.outbound -= 1
            PeerTable.release(peer)

    async def _session(self, a: SimNode, b: SimNode, peer: Peer, latency: float) -> None:
        r = self.result
        # As in the daemon's _session: b frees the reservation only if this session took
        # it; b's own dial to a may hold it, and must not see a dialled twice at once.
        held = b.peers.get(a.id)
        owns = held is None or not held.in_session
        known_b = b.peers.begin_session(a.id)
        cut = None
        if self.cfg.loss > 0 and self.rng.random() < self.cfg.loss:
            cut = self.rng.randrange(1, 10)  # a session is ~6-10 frames
        link = Link(latency, cut, lambda: a.up and b.up, self._count_bytes)
        results: list[SessionResult | None] = [None, None]

        async def side(i: int, node: SimNode, other: str) -> None:
            with trio.move_on_after(SESSION_TIMEOUT_S) as scope:
                try:
                    results[i] = await run_session(link.ends[i], node.state, node.ctx,
                                                   peer_id=other, initiator=i == 0)
                except LinkCutError:
                    link.cut()
                    return
                finally:
                    link.finish(i)
            if scope.cancelled_caught:
                r.timeouts += 1
                link.cut()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(side, 0, a, b.id)
                nursery.start_soon(side, 1, b, a.id)
            now = self.now()
            ra, rb = results
            if ra is None or rb is None or link.broken:
                r.lost += 1
                a.peers.failed(peer, "session lost", now)
            else:
                r.completed += 1
                PeerTable.completed(peer, now, ", ".join(ra.refused) or None)
                peer_b = known_b if known_b is not None else b.peers.add_inbound(a.id, now)
                if peer_b is not None:
                    PeerTable.completed(peer_b, now, ", ".join(rb.refused) or None)
            for res in results:
                if res is not None:
                    r.entries_sent += res.sent
                    r.entries_accepted += res.received
                    r.refused.update(res.refused)
                    r.duplicates += sum(n for k, n in res.refused.items() if k in DUPLICATE)
        finally:
            if known_b is not None and owns:
                PeerTable.release(known_b)

    def _count_bytes(self, side: int, n: int) -> None:
        self.result.bytes_sent += n


def simulate(cfg: GossipSimConfig) -> GossipSimResult:
    return GossipSim(cfg).run()
