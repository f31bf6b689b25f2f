"""`peerd run`: the long-running node. Wires discovery, transport, gossip, training, state,
the control socket and systemd together; every decision is delegated to a tested module.

Task layout under one trio nursery:

* the **round loop**: blend → K proximal steps → publish, in a worker thread, every
  ``round_interval_s``; it continues when no peer is in reach; it starts once the task's
  data is read, after READY=1 (:mod:`peerd.daemon.launch`), as mDNS does;
* the **gossip loop**: every few seconds (jittered) a session with each known peer that has
  none running; inbound sessions are served by the transport's stream handler;
* **discovery** (mDNS), static and bootstrap peers and the sessions' address exchange
  (:mod:`peerd.daemon.addresses`) feed the peer table; they are hints only — the
  Noise handshake proves a peer's id and the manifest its membership;
* the **control server** answers ``peerd status``/``peerd peers``/``peerd audit``.

SIGTERM/SIGINT cancel the nursery: counters and state are already on disk (every write is
atomic), discovery sends goodbye packets, the transport closes its host, the socket goes.

It must not parse wire bytes or touch files itself: ``peerd.protocol`` and ``peerd.store`` do.
What is settled once before anything runs (the key, the starting manifest, the per-peer byte
budget) is :mod:`peerd.daemon.startup`'s.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import trio

from peerd.control.metrics import StatusMetrics, start_metrics_server
from peerd.control.server import ControlError, ControlServer, Operations
from peerd.control.snapshot import NO_TRANSPORT, TransportSnapshot, build_status
from peerd.control.status import ReachabilityStatus, RelayRow, Status
from peerd.control.tracking import tracked_round
from peerd.core.entry import Schema
from peerd.core.staleness import StalenessMode
from peerd.daemon import sdnotify
from peerd.daemon.addresses import Addresses
from peerd.daemon.config import Config, mode_of
from peerd.daemon.external import ExternalSide
from peerd.daemon.gossiping import Gossiping
from peerd.daemon.host import Metrics
from peerd.daemon.launch import load_data
from peerd.daemon.links import PeerLinks
from peerd.daemon.memory import pin_mmap_threshold
from peerd.daemon.modes import build_mode
from peerd.daemon.modes.base import Mode, run_round
from peerd.daemon.modes.weights import WeightsMode
from peerd.daemon.notices import ConnectionLog, Membership, plural
from peerd.daemon.participation import Participation
from peerd.daemon.startup import (
    DaemonError,
    LateStartupError,
    load_manifest,
    read_node_key,
    transport_config,
)
from peerd.daemon.tracking import open_tracking
from peerd.learn.knowround import task_model
from peerd.learn.learner.fleet import LearnerTask
from peerd.learn.tasks import Task, load_task
from peerd.net.dcutr import HolePunch, serve_hole_punch
from peerd.net.discovery import Discovery, DiscoveryError, open_discovery
from peerd.net.gossip import ReceiveSlots
from peerd.net.reachability import Reachability
from peerd.net.relay import RelayService
from peerd.net.relayclient import RelayClient, split_relay
from peerd.net.transport import Transport, open_transport
from peerd.node.addrbook import AddressBook
from peerd.node.inflight import InFlight
from peerd.node.peers import PeerTable
from peerd.node.state import NodeState
from peerd.protocol.limits import PROTOCOL_VERSION
from peerd.store import ledgerfile, persist
from peerd.store.partials import Partials
from peerd.store.statedir import StateDir

log = logging.getLogger(__name__)


class Daemon(Gossiping):
    def __init__(self, cfg: Config, *, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.now = clock
        self.state = StateDir(cfg.node.state_dir)
        self.key = read_node_key(cfg)
        manifest, envelope = load_manifest(cfg, self.state)
        torch.set_num_threads(cfg.node.torch_threads)
        if cfg.node.lean_memory:
            pin_mmap_threshold()
        t = cfg.task
        # A learner of the user's reads its own data; [learner] model names the model.
        self.task: Task = LearnerTask(cfg.learner.model) if cfg.learner.model is not None \
            else load_task(t.name, partition_spec=t.partition, node_index=t.node_index,
                           node_count=t.node_count, seed=t.seed, csv_glob=t.csv_glob,
                           csv_label=t.csv_label, csv_features=t.csv_features,
                           csv_kind=t.csv_kind)
        self.model = task_model(self.task, t.model)  # [task] model, else the task's own
        learning = cfg.learning
        self.node = NodeState(
            key=self.key, fleet_id=cfg.fleet.fleet_id, manifest=manifest,
            schema=Schema.of(self.model.state_dict()), limits=cfg.validation.limits(),
            tau_max=learning.tau_max, capacity=learning.capacity,
            group=learning.group, capacity_per_group=learning.capacity_per_group,
            mode=StalenessMode(learning.staleness),
            manifest_envelope=None if envelope is None else envelope.envelope,
            encoding=cfg.fleet.entry_encoding,
        )
        self.metrics = Metrics()
        self.peers = PeerTable(self.node.id, rng=random.Random())  # backoff jitter
        self._discovery: Discovery | None = None  # set while mDNS runs
        self.transport: Transport | None = None  # set while the libp2p host is up
        self.relays: RelayClient | None = None  # set while relays are kept (or learned)
        #: AutoNAT dial-backs asked of those relays: a public node needs no reservation.
        self.reachability: Reachability | None = None
        #: ``[network] relay_service``: the hop + rendezvous point on our host, while it runs.
        self.relay: RelayService | None = None
        #: ``[network] hole_punch``: DCUtR on our host, while it runs.
        self.hole_punch: HolePunch | None = None
        self._config_status = cfg.status_config()
        self._written: set[str] = set()
        self._persist_lock = threading.Lock()
        self._ledger = ledgerfile.Saver(self.state)
        self._wake_gossip = trio.Event()
        #: Peers that moved to other addresses: their connection may run over an address
        #: that is gone (TCP notices after minutes), so the next dial starts afresh.
        self._moved: set[str] = set()
        self.listen_addrs: list[str] = []
        self._connections = ConnectionLog(self._admits)
        #: Each connected peer's path and round-trip time (peerd peers).
        self.links = PeerLinks(self.peers)
        self._membership = Membership(cfg.fleet.fleet_id.hex(), self.node.id)
        self.ready = trio.Event()
        self._metrics: StatusMetrics | None = None
        # Peers take turns at the slots: one member's 8 streams queue once, not 8 times.
        self._receive_slots = ReceiveSlots(cfg.network.max_concurrent_receives)
        self._inflight = InFlight()  # no entry downloaded from two peers at once
        self._partials = Partials()  # cut transfers, resumed where they stopped
        self._inbound_sessions = 0  # running sessions that peers opened
        #: Inbound sessions refused because max_inbound_sessions were running.
        self.busy_refusals = 0
        #: Gossip sweeps, sessions this node started, the most started in one sweep and the
        #: most of ours running at once (a slow one outlives its sweep): fanout at work.
        self.gossip_counts = {"sweeps": 0, "dials": 0, "most_dials_in_a_sweep": 0,
                              "most_outbound_at_once": 0}
        self._outbound_sessions = 0
        #: One record per round in the state directory's round log (`peerd audit`).
        self.participation = Participation(cfg.node.state_dir, learning.blend, clock=clock)
        #: ``[tracking]``: each round's metrics to MLflow / TensorBoard, from a thread of its
        #: own (None: no sink configured). Checked before the learner's worker starts.
        self.tracking = open_tracking(cfg, self.node.id)
        #: The learning mode (peerd.daemon.modes): what the node gossips and how it trains.
        #: A typed mode's node state (knowledge, views) holds the same keys, manifest,
        #: ledger and counters as the one built above, under the mode's schema.
        self.mode: Mode = build_mode(mode_of(cfg), self)
        self.node = self.mode.node
        #: Members' signed address records, exchanged in sessions and kept on disk.
        self.addresses = Addresses(AddressBook(self.key, cfg.fleet.fleet_id), self.peers,
                                   self.state, self.now, lambda n: self._member_refusal(n)
                                   is None, lambda: self._wake_gossip.set())
        self._restore()

    # ------------------------------------------------------------------ state
    def _restore(self) -> None:
        counters = self.state.load_counters()
        restored = persist.restore(self.state, self.node, now=self.now())
        stored = ledgerfile.load(self.state)  # after the entries: see NodeState.restore_ledger
        if stored is not None:
            self.node.restore_ledger(stored)
        if self.node.ledger.flagged:
            log.warning("origins flagged for equivocation (`peerd flags clear ORIGIN` accepts "
                        "one again): %s", ", ".join(sorted(self.node.ledger.flagged)))
        own = self.node.own
        version = counters.version
        if own is not None:
            version = max(version, own.entry.meta.version)
            self.mode.restore_own(own)
            own.release()
        if counters.lost:
            log.error("counters were corrupt; resuming after the highest version found")
        self.node.round = counters.round
        self.metrics.round, self.metrics.version = counters.round, version
        # Versions of ours known: a peer's copy of one is only fetched back when newer.
        self.node.own_max_version_seen = max(self.node.own_max_version_seen, version)
        self._written = {f"{i.meta.origin}@{i.meta.version}" for i in self.node.cache}
        known = self.addresses.restore()
        if known:
            log.info("address book: %s restored", plural(known, "member's address",
                                                         "members' addresses"))
        log.info("node %s: round %d, version %d, own entry %s, %s restored (%d refused)",
                 self.node.id, counters.round, version, "restored" if restored.own else "none",
                 plural(restored.cached, "cached entry", "cached entries"), restored.refused)
        self.state.audit("start", node=self.node.id, round=counters.round, version=version,
                         cached=restored.cached, refused=restored.refused)
        self._membership.tell(self.membership())

    def _persist(self) -> None:
        """Runs in a worker thread: cache entries not yet on disk and the index. One at a
        time: sessions that end together each call this from their own thread."""
        with self._persist_lock:
            self._written = persist.save_cache(self.state, self.node, self._written)

    async def _save_ledger(self) -> None:
        """Persist the ledger if it changed: snapshot here, on the loop thread (the only one
        that touches the ledger), written from a worker."""
        view = self.node.ledger.view()
        if self._ledger.stale(view):
            await trio.to_thread.run_sync(self._ledger.save, view)

    def _clear_flag(self, origin: str) -> bool:
        """The control socket's ``clear_flag`` (loop thread): written before the operator is
        answered, so a restart right after keeps the flag cleared (one small fsync)."""
        if not self.node.ledger.clear_flag(origin):
            return False
        self._ledger.save(self.node.ledger.view())
        self.state.audit("flag_cleared", origin=origin)
        log.warning("equivocation flag of %s cleared by the operator", origin)
        return True

    # ------------------------------------------------------------------ rounds
    async def _round(self) -> None:
        if await run_round(self, self.mode):
            self._wake_gossip.set()
        if self.tracking is not None:
            self._track()
        if self._metrics is not None:
            self._metrics.update(self.status())

    def _track(self) -> None:
        """Hand the round just recorded to the tracking thread (only enqueues)."""
        assert self.tracking is not None
        m, record = self.metrics, self.participation.last
        self.tracking.submit(tracked_round(
            round_no=m.round, ts=self.now(), train_loss=m.train_loss, val_loss=m.val_loss,
            val_accuracy=m.val_accuracy, examples=m.examples, cache=len(self.node.cache),
            version=m.version, published=record is not None and record.published is not None,
            learner=None if record is None else record.learner))

    async def _round_loop(self) -> None:
        interval = self.cfg.learning.round_interval_s
        while True:
            started = trio.current_time()
            try:
                await self._round()
            except (OSError, ValueError, RuntimeError) as exc:
                # A bad CSV row set, a full disk: log, keep the node alive, retry next round.
                log.error("round failed: %s", exc)
                self.state.audit("round_failed", error=str(exc)[:500])
            # An external learner's publish wakes the loop: its round signs it now.
            with trio.move_on_after(max(0.0, interval - (trio.current_time() - started))):
                ext = self._external()
                if ext is None:
                    await trio.sleep_forever()
                else:
                    await ext.round_wanted()

    def _external(self) -> ExternalSide | None:
        """``[learner] kind = "external"``'s socket side (None: another learner or mode)."""
        return self.mode.external if isinstance(self.mode, WeightsMode) else None

    # ------------------------------------------------------------------ run
    async def run(self) -> None:
        cfg = self.cfg
        stop_metrics = None
        if cfg.network.metrics_listen:
            self._metrics = StatusMetrics()
            try:
                port, stop_metrics = start_metrics_server(cfg.network.metrics_listen,
                                                          self._metrics)
            except OSError as exc:  # a start-up failure: one line, exit 2 (cli/run.py)
                raise DaemonError(f"[network] metrics_listen {cfg.network.metrics_listen}: "
                                  f"{exc.strerror or exc}") from None
            log.info("metrics on %s (port %d)", cfg.network.metrics_listen, port)
        try:
            await self._run()
        finally:
            self.close()
            if stop_metrics is not None:
                stop_metrics()
            if self.ready.is_set():
                log.info("stopped: node %s at round %d, version %d", self.node.id,
                         self.metrics.round, self.metrics.version)

    async def _run(self) -> None:
        cfg = self.cfg
        tcfg = transport_config(cfg, self.node.schema)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._signals, nursery.cancel_scope)
            # The socket before the host: a socket in use stops start-up before it listens.
            server = await ControlServer.open(cfg.node.control_socket,
                                              Operations(self.status, self._clear_flag,
                                                         self.participation.answer),
                                              group=cfg.node.socket_group)
            nursery.start_soon(server.serve)
            external = self._external()
            if external is not None:  # bound before READY=1, as the control socket
                try:
                    await external.open()
                except ControlError as exc:
                    raise DaemonError(f"[learner] kind = \"external\": {exc.message}") from None
                nursery.start_soon(external.serve)
            async with open_transport(self.key, self._inbound, tcfg, admit=self._admits,
                                      on_refused=self._refused_connection,
                                      on_connected=self._on_connected,
                                      on_disconnected=self._on_disconnected) as transport:
                self.transport = transport
                self.listen_addrs = list(transport.listen_addrs)
                log.info("listening on %s as %s (control socket %s)",
                         ", ".join(self.listen_addrs), self.node.id, cfg.node.control_socket)
                self.peers.add_static(cfg.network.static_peers, self.now())
                # Without configured relays too, unless learning is off: members running a
                # relay service may be learned from the address book (peerd.node.relaylearn).
                if cfg.network.relays or cfg.network.learn_relays:
                    self.reachability = Reachability(transport, cfg.network.relays)
                    self.relays = RelayClient(
                        transport, cfg.network.relays, cfg.fleet.fleet_id,
                        is_member=self._may_be_member, on_found=self.addresses.found,
                        on_change=lambda: self._wake_gossip.set(),
                        on_reserved=self.peers.retry_via_relay, clock=self.now,
                        needs_reservation=self.reachability.needs_relay)
                try:
                    await self._serve(transport)
                finally:
                    self.relays = self.reachability = None

    async def _serve(self, transport: Transport) -> None:
        async with trio.open_nursery() as inner:
            inner.start_soon(self._gossip_loop, transport, inner)
            inner.start_soon(self.links.start(
                transport, lambda: self._listed_connected(transport)).run)
            if self.cfg.network.mdns:  # probing takes a second or two: READY does not wait
                inner.start_soon(self._discover, transport.port)
            if self.cfg.network.bootstrap:
                inner.start_soon(self.addresses.bootstrap, self.cfg.network.bootstrap)
            if self.cfg.network.relay_service:
                # For members behind NATs (peerd.net.relay); admission holds on this host, so
                # only members reserve and register. Answering before READY=1.
                self.relay = RelayService(transport.host)
                await inner.start(self.relay.run)
            if self.reachability is not None:  # reserves until it says "public"
                inner.start_soon(self.reachability.run)
            if self.relays is not None:  # reservations, rendezvous, the STOP side
                if self.cfg.network.hole_punch:  # before the relay client dials its relays
                    # The relays are identified though not members: their answers carry
                    # the public address our NAT maps us to, which DCUtR tells the other
                    # side to dial. (Learned relays are members: identified as any is.)
                    transport.library_tables.identify_also(
                        frozenset(split_relay(a)[1] for a in self.cfg.network.relays))
                # A relay service of our own serves /stop already: the client uses its hop.
                inner.start_soon(self.relays.run,
                                 None if self.relay is None else self.relay.hop)
                if self.cfg.network.hole_punch:
                    await inner.start(self._hole_punch, transport)
            # READY=1: the control socket answers, the host listens, the manifest is loaded
            # (docs/operations.md). The data loads after it, while mDNS probes and peers
            # connect; a failure there still stops the node as a start-up failure.
            self.ready.set()
            sdnotify.ready()
            self.state.audit("ready", addrs=self.listen_addrs)
            await load_data(self.task)
            inner.start_soon(self._round_loop)

    async def _hole_punch(self, transport: Transport, *,
                          task_status: Any = trio.TASK_STATUS_IGNORED
                          ) -> None:
        """DCUtR beside the relay client (peerd.net.dcutr): members only, bounded."""
        self.hole_punch = HolePunch(transport.host, self._admits)
        try:
            await serve_hole_punch(self.hole_punch, task_status=task_status)
        finally:
            self.hole_punch = None

    async def _discover(self, port: int) -> None:
        cfg = self.cfg
        try:
            async with open_discovery(
                node_id=self.node.id, fleet_id=cfg.fleet.fleet_id.hex(), port=port,
                on_peer=self._on_peer, protocol_version=PROTOCOL_VERSION,
                interfaces=list(cfg.network.mdns_interfaces) or None,
                on_peer_lost=self._on_peer_lost, is_member=self._may_be_member,
            ) as discovery:
                self._discovery = discovery
                try:
                    await trio.sleep_forever()
                finally:
                    self._discovery = None
        except DiscoveryError as exc:
            raise LateStartupError(f"mDNS: {exc}") from None

    async def _signals(self, scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("received %s: shutting down", signal.Signals(signum).name)
                sdnotify.stopping()
                # A round waiting on the learner's worker holds the nursery up to timeout_s:
                # without its worker it ends at once (that round fails, nothing published).
                if isinstance(self.mode, WeightsMode) and self.mode.worker is not None:
                    self.mode.worker.kill()
                scope.cancel()
                return

    def close(self) -> None:
        """Stop what runs beside the daemon's threads (the learner's worker process, the
        tracking thread once it has written what is queued)."""
        if isinstance(self.mode, WeightsMode):
            self.mode.close()
        if self.tracking is not None:
            self.tracking.close()

    # ------------------------------------------------------------------ status
    def _listed_connected(self, t: Transport) -> list[str]:
        """Connected peers the status lists and the pinger pings: a stranger's connection
        (closed at once, or on probation) is neither."""
        return [p for p in t.connected_peers() if p in self.peers or self._admits(p)]

    def status(self) -> Status:
        t = self.transport
        link = NO_TRANSPORT
        if t is not None:
            bytes_in, bytes_out = t.byte_totals()
            connected = frozenset(self._listed_connected(t))
            link = TransportSnapshot(connected=connected,
                                     peers=t.peer_stats(), bytes_in=bytes_in,
                                     bytes_out=bytes_out,
                                     links=self.links.snapshot(t, connected))
        return build_status(node=self.node, numbers=self.metrics, peers=self.peers,
                            transport=link, config=self._config_status,
                            # Read live: concrete addresses that follow the host's.
                            listen=self.listen_addrs if t is None else t.listen_addrs,
                            now=self.now(), membership=self.membership(),
                            gossip={"busy_refusals": self.busy_refusals,
                                    "duplicates_avoided": self._inflight.deduplicated,
                                    "transfers_resumed": self._partials.resumed,
                                    "bytes_not_resent": self._partials.bytes_saved,
                                    **self.gossip_counts},
                            libp2p=None if t is None else {
                                **t.library_tables.counts(),
                                **({} if self.hole_punch is None
                                   else self.hole_punch.counts())},
                            views=self.mode.status_block(self.now()),
                            learner=self.mode.learner_block()
                            if isinstance(self.mode, WeightsMode) else None,
                            tracking=None if self.tracking is None
                            else self.tracking.snapshot(),
                            reachability=self._reachability_status())

    def _reachability_status(self) -> ReachabilityStatus | None:
        r = self.reachability
        if r is None:
            return None
        s = r.snapshot()
        relays = () if self.relays is None else tuple(
            RelayRow(addr=st.addr, source="learned" if st.learned else "configured",
                     reserved_until=st.reserved_until, failures=st.failures,
                     last_error=st.last_error) for st in self.relays.states())
        return ReachabilityStatus(verdict=str(s.verdict), servers=s.servers, reached=s.reached,
                                  not_reached=s.not_reached, checked_s_ago=s.checked_s_ago,
                                  last_error=s.last_error, relays=relays)
