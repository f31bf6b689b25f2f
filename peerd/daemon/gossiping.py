"""The daemon's gossip side: sessions with peers (who may hold one, what a session's outcome
does to the peer table, the state directory and the audit), the sweep that dials known
peers, and what discovery and the transport report about peers.

A mixin of :class:`peerd.daemon.daemon.Daemon` (split from it by idea: the rest of the
daemon is start-up, rounds and status); it uses only the attributes declared below, which
the daemon sets in ``__init__``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from peerd.daemon.addresses import Addresses
from peerd.daemon.config import Config
from peerd.daemon.memory import release_freed_memory
from peerd.daemon.notices import ConnectionLog, Membership, plural, short_id
from peerd.daemon.participation import Participation
from peerd.net.discovery import Discovery, PeerHint
from peerd.net.gossip import ReceiveSlots, SessionContext, run_session
from peerd.net.reachability import Reachability
from peerd.net.relayclient import RelayClient
from peerd.net.transport import (
    PeerBudgetError,
    Stream,
    StreamLimitError,
    Transport,
    TransportError,
)
from peerd.node.inflight import InFlight
from peerd.node.peers import Peer, PeerTable
from peerd.node.relaylearn import pick_learned
from peerd.node.state import NodeState
from peerd.protocol import messages as msg
from peerd.protocol.errors import ProtocolError
from peerd.protocol.peerrecord import is_circuit
from peerd.store import persist
from peerd.store.partials import Partials
from peerd.store.statedir import StateDir

#: The daemon's logger: operators (and tests) read these lines as the daemon's.
log = logging.getLogger("peerd.daemon.daemon")

#: Seconds between gossip sweeps over known peers (jittered ±50 % so meshes don't pulse).
GOSSIP_INTERVAL_S = 3.0
#: A whole session (hello to last entry) must finish within this; a stalled peer is cut off.
SESSION_TIMEOUT_S = 300.0


class Gossiping:
    """Sessions, dials and peer events of one daemon (module docstring)."""

    cfg: Config
    now: Callable[[], float]
    state: StateDir
    node: NodeState
    peers: PeerTable
    transport: Transport | None
    #: The relay client while it runs (None: no relays configured and learn_relays off).
    relays: RelayClient | None
    reachability: Reachability | None
    listen_addrs: list[str]
    addresses: Addresses
    participation: Participation
    _discovery: Discovery | None
    _membership: Membership
    _connections: ConnectionLog
    _receive_slots: ReceiveSlots
    _inflight: InFlight
    _partials: Partials
    _moved: set[str]
    _wake_gossip: trio.Event
    _inbound_sessions: int
    _outbound_sessions: int
    busy_refusals: int
    gossip_counts: dict[str, int]

    if TYPE_CHECKING:  # the daemon's (state): a session persists what it received
        def _persist(self) -> None: ...
        async def _save_ledger(self) -> None: ...

    def _learn_relays(self) -> None:
        """Each sweep: the relays learned from the address book (peerd.node.relaylearn) to
        the relay client and the AutoNAT asking; an expired or pruned record, or a member
        no longer listed, drops its relay here."""
        if self.relays is None or not self.cfg.network.learn_relays:
            return
        learned = pick_learned(
            self.addresses.book.records(), self_id=self.node.id, now=self.now(),
            is_member=lambda n: self._member_refusal(n) is None,
            configured=self.cfg.network.relays,
            current=[s.addr for s in self.relays.states() if s.learned])
        if self.relays.set_learned(learned) and self.reachability is not None:
            self.reachability.set_servers((*self.cfg.network.relays, *learned))

    def _session_ctx(self) -> SessionContext:
        def adopted(m: msg.ManifestMessage) -> None:
            persist.save_manifest(self.state, m)
            self.state.audit("manifest", seq=self.node.manifest.seq)
            if self._discovery is not None:  # records of newly admitted nodes count now
                self._discovery.recheck()
            if self.transport is not None:  # a member it revoked keeps no connection
                self.transport.close_unadmitted()
            self.addresses.prune()  # nor its address record

        return SessionContext(admin_key=self.cfg.fleet.admin_public_key, now=self.now,
                              on_manifest=adopted,
                              receive_slots=self._receive_slots,
                              spool_dir=self.state.blobs, inflight=self._inflight,
                              address_book=self.addresses.book,
                              on_addrs=self.addresses.learned, partials=self._partials)

    async def _session(self, stream: Stream, peer_id: str, initiator: bool) -> None:
        # A known peer is reserved (not dialled meanwhile); one that dialled us unannounced
        # enters the table only once this session proved it a member: never a stranger.
        # Only the session that took the reservation frees it: our sweep's dial took it in
        # PeerTable.due, and an inbound session that ends meanwhile must not free a peer the
        # dial still talks to (a fleet of 32 then dialled one peer twice at once).
        held = self.peers.get(peer_id)
        owns = held is None or not held.in_session
        known = self.peers.begin_session(peer_id)
        try:
            with trio.move_on_after(SESSION_TIMEOUT_S) as scope:
                result = await run_session(stream, self.node, self._session_ctx(),
                                           peer_id=peer_id, initiator=initiator)
            now = self.now()
            if scope.cancelled_caught:
                if known is not None:
                    self.peers.failed(known, "session timed out", now)
                return
            self._session_outcome(known, peer_id, now, ", ".join(result.refused) or None)
            if result.refused_as is not None or not result.refused:
                self._membership.refused_as = result.refused_as
                self._membership.tell(self.membership(), peer_id)
            self.node.release()  # pages the sends and verifications read
            if result.received:
                await trio.to_thread.run_sync(self._persist)
                release_freed_memory()  # verification's temporaries, frames of refused entries
                log.info("received %s from %s", plural(result.received, "entry", "entries"),
                         short_id(peer_id))
            for reason, n in result.refused.items():
                self.state.audit("refused", peer=peer_id, reason=reason, count=n)
                self.participation.refused(peer_id, reason, n)
            await self._save_ledger()  # what was accepted or flagged must survive a restart
            await self.addresses.save_if_changed()
            await self._trim_connections()
        finally:
            if known is not None and owns:
                PeerTable.release(known)

    async def _trim_connections(self) -> None:
        """Close the least recently synchronised idle connections beyond
        ``[network] max_connections`` (peerd.node.peers.PeerTable.idle_connected)."""
        t = self.transport
        if t is None:
            return
        for peer_id in self.peers.idle_connected(t.connected_peers(),
                                                 self.cfg.network.max_connections):
            log.debug("closing the idle connection to %s (max_connections)", short_id(peer_id))
            await t.disconnect(peer_id)

    def _session_outcome(self, known: Peer | None, peer_id: str, now: float,
                         refused: str | None) -> None:
        """Record a session that ran to its end: with a member, a sign of life (the backoff
        starts over); with anyone else, a refusal (backed off; forgotten unless static,
        once we hold a signed manifest to judge by)."""
        refusal = self._member_refusal(peer_id)
        if refusal is None:
            peer = known if known is not None else self.peers.add_inbound(peer_id, now)
            if peer is not None:
                PeerTable.completed(peer, now, refused)
        elif known is not None:
            self.peers.failed(known, f"refused: {refusal}", now, refused=True)
            if known.source != "static" and self.node.manifest_envelope is not None:
                self.peers.forget(peer_id)

    def membership(self) -> str:
        """"member", or why not (see :class:`peerd.daemon.notices.Membership`)."""
        return self._membership.verdict(own_refusal=self._member_refusal(self.node.id),
                                        signed=self.node.manifest_envelope is not None)

    def _member_refusal(self, peer_id: str) -> str | None:
        """None for an active member under our manifest, else why not (not_member, revoked,
        expired)."""
        try:
            self.node.manifest.check_member(peer_id, self.now())
        except ProtocolError as exc:
            return str(exc.reason)
        return None

    def _admits(self, peer_id: str) -> bool:
        """The transport's admission (mend 8): only active members hold a connection they
        opened; anyone else gets one session on probation at most (a newcomer brings the
        manifest that admits it), or is closed right after the handshake."""
        return self._member_refusal(peer_id) is None

    def _may_be_member(self, node_id: str) -> bool:
        """Discovery's filter: an mDNS record of a non-member is ignored. Without a signed
        manifest nobody can be judged yet, so every record counts until one arrives."""
        return self.node.manifest_envelope is None or self._member_refusal(node_id) is None

    def _refused_connection(self, peer_id: str) -> None:
        """A connection closed by the transport without a session: counted under the reason
        (no audit line: outsiders could flood the audit log with them)."""
        self.node.reject(self._member_refusal(peer_id) or "not_member")

    async def _inbound(self, stream: Stream) -> None:
        if self._inbound_sessions >= self.cfg.network.max_inbound_sessions:
            # Every peer of a large fleet may pick us in the same sweep; each session costs a
            # digest merge and maybe a model-sized receive. The dialler sees a closed stream,
            # backs off for seconds (a proven member: BACKOFF_MEMBER_MAX_S) and meanwhile
            # syncs with others; nothing is lost, the next session carries it.
            self.busy_refusals += 1
            log.debug("busy: refused an inbound session from %s", short_id(stream.peer_id))
            await stream.reset()
            return
        self._inbound_sessions += 1
        try:
            await self._session(stream, stream.peer_id, initiator=False)
        finally:
            self._inbound_sessions -= 1

    async def _dial(self, transport: Transport, peer: Peer) -> None:
        if peer.id in self._moved:
            self._moved.discard(peer.id)
            await transport.disconnect(peer.id)
        try:
            await self._session_over(transport, peer, retry=transport.is_connected(peer.id))
        except (TransportError, OSError) as exc:
            self.peers.failed(peer, str(exc), self.now())  # unreachable: backed off
            # A bootstrap peer is what the operator counts on to join: say it (backed off,
            # so at most a dozen lines an hour).
            log.log(logging.WARNING if peer.source == "bootstrap" else logging.DEBUG,
                    "gossip with %s failed: %s", short_id(peer.id), exc)

    async def _session_over(self, transport: Transport, peer: Peer, *, retry: bool) -> None:
        """Our session with ``peer`` over a new stream. With ``retry`` (a connection was up
        before this dial), a stream that cannot be opened on it means the network broke that
        connection (a NAT router that forgot its mapping, a partition): that says nothing
        about whether the peer can be reached, so the connection is dropped and one fresh
        dial tried at once, instead of backing the peer off (issue 27: 5-20 s after a NAT
        rebinding). Our own limits (streams, byte budgets) break no connection: raised."""
        opened = False
        try:
            if self.relays is not None and not transport.is_connected(peer.id):
                # Direct addresses first, then the circuits (peerd.net.relayclient).
                await self.relays.connect(peer.id, peer.addrs)
            # A circuit cannot go through the host's TCP dial: without a relay client, a
            # member learned only at its relays is out of reach.
            direct = [a for a in peer.addrs if not is_circuit(a)]
            async with transport.open_stream(peer.id, direct) as stream:
                opened = True
                await self._session(stream, peer.id, initiator=True)
        except (StreamLimitError, PeerBudgetError):
            raise
        except (TransportError, OSError) as exc:
            if not retry or opened:
                raise
            log.debug("a stream to %s failed on its connection (%s): dialling afresh",
                      short_id(peer.id), exc)
            await transport.disconnect(peer.id)
            await self._session_over(transport, peer, retry=False)

    async def _gossip_loop(self, transport: Transport, nursery: trio.Nursery) -> None:
        while True:
            # Our address record follows the host's addresses (held while they stay).
            t = self.transport  # read live: concrete addresses that follow the host's
            self.addresses.sign_own(self.listen_addrs if t is None else t.listen_addrs,
                                    self.cfg.network.listen_host,
                                    () if self.relays is None else self.relays.circuit_addrs(),
                                    self.cfg.network.relay_service)
            self._learn_relays()
            # Reserved until _dial_and_release ends. At most `fanout` of our sessions run
            # at once, not merely start per sweep: every discovery and publish wakes this
            # loop, and 32 daemons sharing 2 cores once had 31 slow sessions each at once.
            free = max(self.cfg.network.fanout - self._outbound_sessions, 0)
            due = self.peers.due(self.now(), fanout=free)
            counts = self.gossip_counts
            counts["sweeps"] += 1
            counts["dials"] += len(due)
            counts["most_dials_in_a_sweep"] = max(counts["most_dials_in_a_sweep"], len(due))
            for peer in due:
                nursery.start_soon(self._dial_and_release, transport, peer)
            with trio.move_on_after(GOSSIP_INTERVAL_S * random.uniform(0.5, 1.5)):
                await self._wake_gossip.wait()
            self._wake_gossip = trio.Event()

    async def _dial_and_release(self, transport: Transport, peer: Peer) -> None:
        self._outbound_sessions += 1
        counts = self.gossip_counts
        counts["most_outbound_at_once"] = max(counts["most_outbound_at_once"],
                                              self._outbound_sessions)
        try:
            await self._dial(transport, peer)
        finally:
            self._outbound_sessions -= 1
            PeerTable.release(peer)

    def _on_peer(self, hint: PeerHint) -> None:
        known = self.peers.get(hint.node_id)
        if known is not None and not set(known.addrs) <= set(hint.multiaddrs):
            log.info("%s moved to %s", short_id(hint.node_id), ", ".join(hint.multiaddrs))
            self._moved.add(hint.node_id)
            self._wake_gossip.set()
        # Discovery passes members only (_may_be_member); the table is bounded besides.
        if self.peers.on_hint(hint.node_id, hint.multiaddrs, self.now()):
            log.info("discovered %s at %s", short_id(hint.node_id), ", ".join(hint.multiaddrs))
            self._wake_gossip.set()

    def _on_connected(self, peer_id: str) -> None:
        t = self.transport
        self._connections.connected(peer_id, t.remote_address(peer_id) if t else None)

    def _on_disconnected(self, peer_id: str) -> None:
        t = self.transport
        self._connections.disconnected(peer_id,
                                       still_connected=t is not None and t.is_connected(peer_id))

    def _on_peer_lost(self, node_id: str) -> None:
        if self.peers.on_lost(node_id):
            log.info("%s said goodbye over mDNS", short_id(node_id))
