"""Mend 15: what py-libp2p 0.8.1 keeps per remote peer, bounded by us, and its own stream
handlers fenced off from the host.

Identities cost nothing to mint, so every table a library fills per remote peer is a table
an outsider can grow at will. py-libp2p keeps several (read from its source; the test
walks the live host's attributes for any that grow): the peerstore (keys, addresses,
protocols, metadata, latency, signed records), the host's identified peers and identify
tasks, the swarm's connections, stream round-robin index and per-connection health, the
auto-connector's dial and disconnect times, the tag store, the resource manager's
connection tracker and the observed-address manager. Two of its own defects turned that
into a remote crash (issue 24): the peerstore caps itself at 1,000 entries and evicts
address-less ones first, the host's own entry among them (it holds only keys), after
which the identify handler's ``host.get_public_key()`` raises ``PeerStoreError``; and an
exception in one of the library's own stream handlers (identify, ping) propagates out of
the swarm and ends ``host.run()``. About 1,000 strangers, each dialling once with a fresh
key and holding a session on probation (while which the host identified it), stopped the
daemon.

The mend, per host (:class:`PeerTables`, installed by :class:`peerd.net.transport.Transport`):

- the peerstore holds at most :data:`~peerd.net.transport_config.MAX_LIBRARY_PEERS`
  peers, evicting only peers with no connection, outsiders before members, oldest first,
  and never the host's own entry;
- the host runs identify only with admitted peers (the daemon's members): an outsider's
  addresses, protocols and observed address are never stored (peerd dials from its own
  discovery and static peers, so it has no use for them). The one exception is
  :meth:`PeerTables.identify_also`: the relays of ``[network] relays`` when hole punching
  is on, whose identify answers tell us the public address our NAT gives us (DCUtR's
  address prediction reads nothing else);
- every table above forgets an outsider once its last connection is gone, so the tables
  hold the members and the few outsiders connected at the moment, not every key ever seen;
- the task serving an inbound connection ends when that connection closes: py-libp2p
  keeps it (and its inbound-limiter slot, mend 1) until the whole swarm ends, ~9 KB and
  one task for every connection the host ever accepted;
- the swarm's one entry point for inbound streams (which dispatches to identify, ping
  and ours) and the host's identify task catch whatever they raise: logged, counted
  (:attr:`PeerTables.handler_errors`) and the stream reset; a peer that is not admitted
  also loses its connection.

It must not decide who is admitted (that is the caller's predicate, :mod:`peerd.net.admission`)
nor open connections or streams.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import trio
from libp2p.abc import IHost, IMuxedConn, INetStream
from libp2p.peer.id import ID

from peerd.net.transport_config import MAX_LIBRARY_PEERS

logger = logging.getLogger(__name__)

@dataclass
class _Inbound:
    """The connection one inbound-connection task upgraded, once it has."""

    conn: IMuxedConn | None = None
    upgraded: trio.Event = field(default_factory=trio.Event)


#: Set by the task serving one inbound connection (its context reaches the upgrade call).
_INBOUND: ContextVar[_Inbound | None] = ContextVar("peerd_inbound_connection", default=None)

#: Whether a peer id is kept (an admitted member) or forgotten once disconnected.
KeepPeer = Callable[[str], bool]


class PeerTables:
    """The bounds and fences of mend 15 on one host; :meth:`install` once, before it runs."""

    def __init__(self, host: IHost, keep: KeepPeer | None,
                 *, max_peers: int = MAX_LIBRARY_PEERS) -> None:
        self._host = host
        self._keep = keep
        self._max_peers = max_peers
        #: Inbound streams (identify, ping, ours) and identify tasks whose library code raised.
        self.handler_errors = 0
        #: Outsiders whose library state was dropped when their last connection closed.
        self.forgotten = 0
        #: Peerstore entries evicted to stay within the bound.
        self.evicted = 0
        #: Outsiders identified all the same (a bounded set the caller names).
        self._identify_also: frozenset[str] = frozenset()

    def kept(self, peer_id: str) -> bool:
        return self._keep is None or bool(self._keep(peer_id))

    def identify_also(self, peer_ids: frozenset[str]) -> None:
        """Identify these peers too, though not kept (the configured relays, for the
        observed address DCUtR predicts from): a few ids named in the config, not a table
        a peer can grow."""
        self._identify_also = peer_ids

    def install(self) -> None:
        host: Any = self._host  # BasicHost's private parts are what is being mended
        store: Any = host.get_peerstore()
        store.max_peers = self._max_peers
        store._enforce_peer_limit = self._enforce_peer_limit
        should_identify = host._should_identify_peer

        def identify_only_kept(peer: ID) -> bool:
            wanted = self.kept(str(peer)) or str(peer) in self._identify_also
            return wanted and bool(should_identify(peer))

        host._should_identify_peer = identify_only_kept
        identify = host._identify_peer

        async def identify_fenced(peer: ID, *, reason: str) -> None:
            # Runs as a trio *system* task: an exception there would end the whole run.
            try:
                await identify(peer, reason=reason)
            except Exception as e:  # noqa: BLE001 - the fence is the point
                self.handler_errors += 1
                logger.info("identify with %s failed inside libp2p: %r", peer, e)

        host._identify_peer = identify_fenced
        swarm: Any = host.get_network()
        swarm.set_stream_handler(self._fenced(host._swarm_stream_handler))
        self._end_inbound_tasks_with_their_connection(swarm)

    @staticmethod
    def _end_inbound_tasks_with_their_connection(swarm: Any) -> None:
        """After upgrading an inbound connection, py-libp2p's handler waits for the swarm
        to finish (trio's listener closes the socket when the handler returns): here it
        is cancelled once its own connection has closed instead."""
        upgrade = swarm.upgrade_inbound_raw_conn
        handle = swarm._handle_inbound_connection  # the listener looks it up per call

        async def upgrade_noted(raw_conn: Any, maddr: Any) -> IMuxedConn:
            muxed: IMuxedConn = await upgrade(raw_conn, maddr)
            inbound = _INBOUND.get()
            if inbound is not None:
                inbound.conn = muxed
                inbound.upgraded.set()
            return muxed

        async def handle_until_closed(read_write_closer: Any, maddr: Any) -> None:
            inbound = _Inbound()
            _INBOUND.set(inbound)  # this task's context: the upgrade runs in this task
            async with trio.open_nursery() as nursery:

                async def end_when_closed() -> None:
                    await inbound.upgraded.wait()
                    closed = getattr(inbound.conn, "event_closed", None)
                    if closed is None:
                        return  # not a muxer we know: py-libp2p's own lifetime applies
                    await closed.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(end_when_closed)
                try:
                    await handle(read_write_closer, maddr)
                finally:
                    nursery.cancel_scope.cancel()

        swarm.upgrade_inbound_raw_conn = upgrade_noted
        swarm._handle_inbound_connection = handle_until_closed

    def _fenced(self, handler: Callable[[INetStream], Awaitable[None]]
                ) -> Callable[[INetStream], Awaitable[None]]:
        async def fenced(stream: INetStream) -> None:
            try:
                await handler(stream)
            except Exception as e:  # noqa: BLE001 - nothing a peer sends may end the host
                self.handler_errors += 1
                peer = str(getattr(stream.muxed_conn, "peer_id", "?"))
                logger.info("inbound %s stream from %s failed inside libp2p: %r",
                            stream.get_protocol() or "unnegotiated", peer, e)
                try:
                    await stream.reset()
                except Exception as reset_error:  # noqa: BLE001 - already torn down
                    logger.debug("resetting it failed: %r", reset_error)
                if not self.kept(peer):
                    try:
                        await stream.muxed_conn.close()
                    except Exception as close_error:  # noqa: BLE001 - already torn down
                        logger.debug("closing its connection failed: %r", close_error)

        return fenced

    # -- the peerstore's bound --

    def _connected(self, peer: ID) -> bool:
        conns = self._host.get_network().connections.get(peer, [])
        return any(not getattr(c, "is_closed", False) for c in conns)

    def _enforce_peer_limit(self) -> None:
        """Replaces the peerstore's own: never the host's entry, never a connected peer;
        outsiders before members, least recently identified first."""
        store: Any = self._host.get_peerstore()
        data: dict[ID, Any] = store.peer_data_map
        excess = len(data) - self._max_peers
        if excess <= 0:
            return
        me = self._host.get_id()
        candidates = sorted(
            (self.kept(str(p)), getattr(d, "last_identified", 0), str(p), p)
            for p, d in data.items() if p != me and not self._connected(p))
        for *_, peer in candidates[:excess]:
            del data[peer]
            store.peer_record_map.pop(peer, None)
            store.addr_update_channels.pop(peer, None)
            self.evicted += 1

    # -- forgetting an outsider --

    def disconnected(self, peer_id: str) -> None:
        """A connection of ``peer_id`` closed: if it was the last one and the peer is not
        kept, every table forgets it."""
        try:
            peer = ID.from_base58(peer_id)
        except Exception:  # noqa: BLE001 - not a peer id the swarm could hold
            return
        if peer == self._host.get_id() or self._connected(peer) or self.kept(peer_id):
            return
        self.forget(peer)

    def forget(self, peer: ID) -> None:
        for table in self._per_peer_tables(forgettable=True):
            if isinstance(table, dict):
                table.pop(peer, None)
            else:
                table.discard(peer)
        limiter: Any = getattr(getattr(self._host.get_network(), "_resource_manager", None),
                               "connection_rate_limiter", None)
        if limiter is not None:  # keyed by a string of its own making
            try:
                key = limiter._get_entity_key(peer_id=peer)
                limiter._token_buckets.pop(key, None)
                limiter._last_request_times.pop(key, None)
            except Exception as e:  # noqa: BLE001 - a renamed internal: the test notices
                logger.debug("forgetting %s's connection rate bucket failed: %r", peer, e)
        self.forgotten += 1

    def _per_peer_tables(self, *, forgettable: bool = False,
                         ) -> Iterator[dict[Any, Any] | set[Any]]:
        """The library's tables keyed by peer id (py-libp2p 0.8.1's attribute names; one
        that a later release renames is skipped, and the bound test then fails).
        ``forgettable``: only those we may edit; the connection tracker keeps its own
        counts consistent with its per-peer sets (it empties them itself on close)."""
        host: Any = self._host
        swarm: Any = host.get_network()
        store: Any = host.get_peerstore()
        owners: list[tuple[Any, tuple[str, ...]]] = [
            (store, ("peer_data_map", "peer_record_map", "addr_update_channels")),
            (host, ("_identified_peers", "_identify_inflight")),
            (swarm, ("_round_robin_index", "health_data", "_health_metrics_collector")),
            (getattr(swarm, "auto_connector", None),
             ("_recent_disconnects", "_last_connect_attempt", "_failure_counts")),
            (getattr(swarm, "tag_store", None), ("_tags", "_protected")),
        ]
        if not forgettable:
            manager = getattr(swarm, "_resource_manager", None)
            owners.append((getattr(manager, "connection_tracker", None),
                           ("established_per_peer",)))
            owners.append((getattr(manager, "connection_rate_limiter", None),
                           ("_token_buckets", "_last_request_times")))
        for owner, names in owners:
            for name in names:
                table = getattr(owner, name, None)
                if isinstance(table, dict | set):
                    yield table

    def counts(self) -> dict[str, int]:
        """:meth:`sizes` and this mend's counters since start (for ``peerd status``)."""
        return {**self.sizes(), "forgotten": self.forgotten, "evicted": self.evicted,
                "handler_errors": self.handler_errors}

    def sizes(self) -> dict[str, int]:
        """Entries in the library's per-peer tables now (for status and tests)."""
        host: Any = self._host
        return {
            "peerstore": len(host.get_peerstore().peer_data_map),
            "identified": len(getattr(host, "_identified_peers", ())),
            "connections": len(host.get_network().connections),
            "per_peer_entries": sum(len(t) for t in self._per_peer_tables()),
        }
