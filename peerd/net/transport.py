"""The libp2p shell: one host (TCP + Noise + Yamux, Ed25519 identity) behind a small trio API.

Everything libp2p lives in this module and the four beside it, :mod:`peerd.net.stream`
(:class:`Stream`, one open stream), :mod:`peerd.net.swarmconns` (the swarm's connection table),
:mod:`peerd.net.peertables` (the library's per-peer tables, mend 15) and
:mod:`peerd.net.mends` (py-libp2p's defects), so the
gossip layer sees only peer-id strings, multiaddr strings, :class:`Stream` objects and
:class:`TransportError`. The libp2p-free parts, :mod:`peerd.net.framing` and
:mod:`peerd.net.transport_config`, are re-exported from here, and so is :class:`Stream`;
our own per-peer counters, bounded, are :mod:`peerd.net.peercounters`'s;
this module owns the host and its sockets (before it listens, the port probe of
:mod:`peerd.net.mends` runs). It must not know what travels in a frame (that is
:mod:`peerd.net.gossip` and :mod:`peerd.protocol`). The mends for the py-libp2p 0.8.1
defects are numbered and listed in :mod:`peerd.net.mends`, which applies the settings,
patches and hooks among them; mends 2, 3 and 5 are steps of this module's own flow, mend
8's verdict is :mod:`peerd.net.admission`'s, and which connections mend 9 closes is
:mod:`peerd.net.liveness`'s.

Only Noise is offered for security and only Yamux for muxing: py-libp2p's defaults also
offer plaintext and secio, which a downgrade could select, and mplex (6x slower).
Every await on the network has a deadline (the ``*_TIMEOUT_S`` constants).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import multiaddr  # no stubs/py.typed in 0.2.0
import trio
from libp2p import new_host
from libp2p.abc import IHost, INetConn, INetStream, INetwork, INotifee
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import RetryConfig
from libp2p.peer.peerinfo import PeerInfo
from libp2p.rcmgr import Direction
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux

# Framing, settings and counters live in libp2p-free modules; what callers use is
# re-exported ("X as X") so that they keep importing the wire API from this one module.
from peerd.net.addrs import concrete_addrs
from peerd.net.admission import Admission, AdmitPeer, Probation
from peerd.net.framing import FramedStream as FramedStream
from peerd.net.framing import FrameTooLargeError as FrameTooLargeError
from peerd.net.framing import StreamClosedError as StreamClosedError
from peerd.net.framing import TransportError as TransportError
from peerd.net.framing import TransportTimeoutError as TransportTimeoutError
from peerd.net.framing import read_frame as read_frame
from peerd.net.framing import write_frame as write_frame
from peerd.net.framing import write_frame_parts as write_frame_parts
from peerd.net.liveness import Liveness
from peerd.net.mends import (
    apply_library_mends,
    bypass_limits_when_admitted,
    connection_config,
    switch_off_auto_connector,
)
from peerd.net.peercounters import PeerCounters
from peerd.net.peertables import PeerTables
from peerd.net.portprobe import check_port_free
from peerd.net.stream import Stream as Stream
from peerd.net.swarmconns import SwarmConnections, parse_peer_id
from peerd.net.transport_config import (
    DISCONNECT_TIMEOUT_S,
    HOST_CLOSE_TIMEOUT_S,
    MAX_TRACKED_PEERS,
    REFUSAL_LINGER_BYTES,
    REFUSAL_LINGER_S,
    STREAM_OPEN_TIMEOUT_S,
    seed_of,
)
from peerd.net.transport_config import PROTOCOL_ID as PROTOCOL_ID
from peerd.net.transport_config import ByteBudget as ByteBudget
from peerd.net.transport_config import IdentityKey as IdentityKey
from peerd.net.transport_config import PeerBudgetError as PeerBudgetError
from peerd.net.transport_config import PeerStats as PeerStats
from peerd.net.transport_config import StreamLimitError as StreamLimitError
from peerd.net.transport_config import TransportConfig as TransportConfig
from peerd.net.transport_config import tcp_multiaddr as tcp_multiaddr

logger = logging.getLogger(__name__)

# --- identity ---------------------------------------------------------------------------
# A node id is the libp2p peer id of its key: peerd.protocol.identity.node_id_of computes it
# without libp2p (a test checks that the two agree).


def _parse_addrs(addrs: Sequence[str]) -> list[multiaddr.Multiaddr]:
    try:
        return [multiaddr.Multiaddr(a) for a in addrs]
    except Exception as e:
        raise TransportError(f"malformed multiaddr in {list(addrs)!r}") from e


# --- the transport ----------------------------------------------------------------------

StreamHandler = Callable[[Stream], Awaitable[None]]
PeerCallback = Callable[[str], None]


class _ConnectionEvents(INotifee):
    """Forwards libp2p connect/disconnect notifications to plain callbacks."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        peer_id = str(conn.muxed_conn.peer_id)
        self._t._peer_event(peer_id, connected=True)
        # Only connections it opened: ours were dialled on purpose, the session judges them.
        if getattr(conn, "direction", None) == Direction.INBOUND:
            self._t._admission.screen(conn.muxed_conn, peer_id)

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        peer_id = str(conn.muxed_conn.peer_id)
        self._t._peer_event(peer_id, connected=False)
        self._t.library_tables.disconnected(peer_id)  # mend 15: an outsider is forgotten

    async def listen(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        return None

    async def listen_close(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        return None


class Transport:
    """A running libp2p host; obtain one from :func:`open_transport`."""

    def __init__(
        self,
        identity: IdentityKey,
        handler: StreamHandler,
        config: TransportConfig,
        on_connected: PeerCallback | None = None,
        on_disconnected: PeerCallback | None = None,
        admit: AdmitPeer | None = None,
        on_refused: PeerCallback | None = None,
    ) -> None:
        apply_library_mends()
        key_pair = create_new_key_pair(seed_of(identity))
        noise = NoiseTransport(key_pair, noise_privkey=create_new_x25519_key_pair().private_key)
        self._host: IHost = new_host(
            key_pair=key_pair,
            sec_opt={NOISE_PROTOCOL_ID: noise},
            muxer_opt={TProtocol(YAMUX_PROTOCOL_ID): Yamux},
            connection_config=connection_config(config),  # mends 1 and 6
            enable_mDNS=False,  # discovery is ours (peerd.net.discovery), not _p2p._udp
            # identify must not tell peers to dial /ip4/0.0.0.0: the host's addresses of the
            # moment instead, read at each identify, so they follow address changes.
            addrs_factory=_concrete_multiaddrs,
        )
        swarm = self._host.get_network()
        self._conns = SwarmConnections(swarm)
        #: Mend 15: the library's per-peer tables bounded, its own handlers fenced.
        self.library_tables = PeerTables(self._host, admit)
        self.library_tables.install()
        # One retry: the caller (gossip) owns the back-off policy, not the library.
        swarm.retry_config = RetryConfig(max_retries=1)  # type: ignore[attr-defined]
        switch_off_auto_connector(swarm)  # mend 6
        self._admission = Admission(admit, on_refused,
                                    max_probation=config.max_probation_connections,
                                    probation_s=config.probation_s,
                                    close=self._conns.close)
        if admit is not None:  # mend 8: members are never refused for want of a slot
            bypass_limits_when_admitted(swarm, self._admission.admitted)
        self.liveness = Liveness(self._conns.muxed, self._conns.close)  # mend 9
        self._host.set_stream_handler(TProtocol(PROTOCOL_ID), self._on_stream)
        self._host.get_network().register_notifee(_ConnectionEvents(self))
        self._handler = handler
        self._config = config
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self._stats = PeerCounters(config.new_peer_stats, MAX_TRACKED_PEERS)
        self.peer_id: str = str(self._host.get_id().to_base58())

    @property
    def host(self) -> IHost:
        """The libp2p host, for services that run on it beside gossip (the Circuit Relay v2
        hop and client, rendezvous): they register their own protocol handlers."""
        return self._host

    # -- admission (mend 8) --

    def close_unadmitted(self) -> int:
        """Close the connections of every peer not admitted now (a manifest just revoked
        it): admission is otherwise judged only when a connection is opened (mend 8). How
        many peers were cut."""
        if not self._admission.enabled or self._admission.tasks is None:
            return 0
        peers = {p for p, _ in self._conns.muxed(None) if not self._admission.admitted(p)}
        for peer in peers:
            self._admission.tasks.start_soon(self.liveness.drop_all, peer, "not admitted")
        return len(peers)

    def probation_count(self) -> int:
        """Connections of peers not (yet) admitted that are held for one session now."""
        return self._admission.probation_count()

    @property
    def refused_connections(self) -> int:
        """Connections of peers not admitted that were closed without a session."""
        return self._admission.refused

    # -- addresses --

    @property
    def listen_addrs(self) -> list[str]:
        """Where peers can reach us (without ``/p2p/…``): the bound multiaddrs, with the real
        port when 0 was asked and a wildcard host (0.0.0.0, ::) replaced by the host's
        current addresses (:func:`peerd.net.addrs.concrete_addrs`)."""
        return concrete_addrs([str(a) for a in self._host.get_transport_addrs()])

    @property
    def port(self) -> int:
        for a in self._host.get_transport_addrs():
            value = a.value_for_protocol("tcp")
            if value is not None:
                return int(value)
        raise TransportError("host is not listening")

    # -- peers --

    def remote_address(self, peer_id: str) -> str | None:
        """``IP:PORT`` of an open connection with ``peer_id`` (for the logs), None if none."""
        return self._conns.remote_address(peer_id)

    def connection_multiaddrs(self, peer_id: str) -> list[str]:
        """The remote multiaddr of each open connection with ``peer_id`` (``/p2p-circuit``
        in a relayed one's): what its path is read from (:mod:`peerd.node.paths`)."""
        return self._conns.remote_multiaddrs(peer_id)

    def is_connected(self, peer_id: str) -> bool:
        return self._conns.count(peer_id) > 0

    def connection_count(self, peer_id: str) -> int:
        return self._conns.count(peer_id)

    def connected_peers(self) -> list[str]:
        return sorted(str(p) for p in self._host.get_connected_peers())

    def peer_stats(self) -> dict[str, PeerStats]:
        """A snapshot (copies) of the per-peer counters."""
        return self._stats.snapshot()

    def byte_totals(self) -> tuple[int, int]:
        """(bytes in, bytes out) with every peer since start, forgotten ones included."""
        return self._stats.byte_totals()

    async def connect(
        self, peer_id: str, addrs: Sequence[str], *, timeout_s: float | None = None
    ) -> None:
        """Ensure a connection to ``peer_id``; reuses a live one, else dials ``addrs``.

        Addresses are tried one after another within one overall deadline. The Noise
        handshake proves the remote holds ``peer_id``'s key: an address that answers with
        another identity fails.
        """
        pid = parse_peer_id(peer_id)
        if pid == self._host.get_id():
            raise TransportError("refusing to dial ourselves")
        if self.is_connected(peer_id):
            return
        maddrs = _parse_addrs(addrs)
        if not maddrs:
            raise TransportError(f"no address to dial {peer_id}")
        swarm = self._host.get_network()
        for stale in list(swarm.connections.get(pid, [])):
            # Mend 9: a closed connection left in the table (its close ran out of time) makes
            # host.connect return without dialling.
            if getattr(stale, "is_closed", False):
                swarm.remove_conn(stale)  # type: ignore[attr-defined]
        errors: list[str] = []
        try:
            deadline = timeout_s if timeout_s is not None else self._config.dial_timeout_s
            with trio.fail_after(deadline):
                for maddr in maddrs:
                    # The swarm dials at most one peerstore address per transport class and
                    # prefers old ones, so a stale address (peer restarted on a new port)
                    # would shadow the fresh hint: keep only the one we are trying now.
                    self._host.get_peerstore().clear_addrs(pid)
                    # A fresh hint must not be ignored because of an old failure (mend 5).
                    swarm.unblock_peer(pid)  # type: ignore[attr-defined]
                    try:
                        await self._host.connect(PeerInfo(pid, [maddr]))
                    # py-libp2p's dial raises many unrelated types; record each, try the next.
                    except Exception as e:  # noqa: BLE001
                        errors.append(f"{maddr}: {e}")
                        continue
                    if self.is_connected(peer_id):
                        return
                    errors.append(f"{maddr}: no connection")
        except trio.TooSlowError as e:
            raise TransportTimeoutError(f"dial to {peer_id} timed out ({'; '.join(errors)})") from e
        raise TransportError(f"dial to {peer_id} failed: {'; '.join(errors)}")

    async def disconnect(self, peer_id: str) -> None:
        with trio.move_on_after(DISCONNECT_TIMEOUT_S):
            try:
                await self._host.disconnect(parse_peer_id(peer_id))
            except Exception as e:  # noqa: BLE001 - a failed disconnect is only logged
                logger.debug("disconnect from %s failed: %r", peer_id, e)

    @asynccontextmanager
    async def open_stream(
        self,
        peer_id: str,
        addrs: Sequence[str] = (),
        *,
        timeout_s: float = STREAM_OPEN_TIMEOUT_S,
    ) -> AsyncIterator[Stream]:
        """A stream to ``peer_id`` over an existing connection (dialling ``addrs`` if none).

        Closed on normal exit, reset if the body raises.
        """
        pid = parse_peer_id(peer_id)  # before a stats entry exists for a malformed id
        stats = self._stats[peer_id]
        if stats.streams_out >= self._config.max_outbound_streams_per_peer:
            raise StreamLimitError(f"{stats.streams_out} streams open to {peer_id}")
        stats.check_budget(stats.budget_in, f"inbound byte budget for {peer_id}")
        stats.check_budget(stats.budget_out, f"outbound byte budget for {peer_id}")
        stats.streams_out += 1
        try:
            # Mend 9: a stalled connection (or one on an address we lost) is not reused.
            await self.liveness.drop_dead(peer_id)
            if not self.is_connected(peer_id):
                await self.connect(peer_id, addrs)
            try:
                with trio.fail_after(timeout_s):
                    raw = await self._host.new_stream(pid, [TProtocol(PROTOCOL_ID)])
            except trio.TooSlowError as e:
                # Mend 9: no answer at all (a reset or a refusal would be one): the next
                # stream goes over a fresh dial, not over this connection again.
                await self.liveness.drop_all(peer_id, "stream open timed out")
                raise TransportTimeoutError(f"opening a stream to {peer_id} timed out") from e
            except Exception as e:
                raise TransportError(f"opening a stream to {peer_id} failed: {e}") from e
            stream = Stream(raw, str(raw.muxed_conn.peer_id), stats)
            ok = False
            try:
                yield stream
                ok = True
            except TransportTimeoutError:
                # A frame that did not come (or go) in time: the connection is suspect too.
                await self.liveness.close(peer_id, raw.muxed_conn, "stream timed out")
                raise
            finally:
                if ok:
                    await stream.close()
                else:
                    await stream.reset()
        finally:
            stats.streams_out -= 1

    # -- inbound --

    async def _on_stream(self, raw: INetStream) -> None:
        # Runs in libp2p's task: anything escaping here would take the whole host down (mend 3).
        peer_id = "?"
        stats: PeerStats | None = None
        probation: Probation | None = None
        try:
            peer_id = str(raw.muxed_conn.peer_id)
            stats = self._stats[peer_id]
            if not self._admission.screen(raw.muxed_conn, peer_id):  # mend 8
                await Stream(raw, peer_id, stats).reset()
                return
            probation = self._admission.session_started(raw.muxed_conn)
            if stats.streams_in >= self._config.max_inbound_streams_per_peer:
                stats.streams_rejected += 1
                logger.info("peer %s exceeded %d concurrent streams; resetting", peer_id,
                            self._config.max_inbound_streams_per_peer)
                await Stream(raw, peer_id, stats).reset()
                return
            try:
                stats.check_budget(stats.budget_in, f"inbound byte budget for {peer_id}")
            except PeerBudgetError as e:
                # A new session would only be cut off mid-frame: refuse it now.
                logger.info("%s; resetting its stream", e)
                await Stream(raw, peer_id, stats).reset()
                return
        except Exception:
            logger.exception("unexpected error accepting a stream from %s", peer_id)
            return
        stats.streams_in += 1
        stream = Stream(raw, peer_id, stats)
        try:
            with trio.fail_after(self._config.handler_timeout_s):
                await self._handler(stream)
        except trio.TooSlowError:
            stats.handler_errors += 1
            logger.warning("handler for stream from %s timed out; resetting", peer_id)
            await stream.reset()
        except Exception as e:
            stats.handler_errors += 1
            # Expected network failures are routine; anything else is a bug worth a trace.
            if isinstance(e, TransportError):
                logger.info("stream from %s failed: %s", peer_id, e)
            else:
                logger.exception("handler for stream from %s raised; resetting", peer_id)
            await stream.reset()
        else:
            # Refused after its session: it reads why before its connection goes (issue 27).
            if (self._admission.lingers(probation)
                    and not await stream.linger(REFUSAL_LINGER_S, REFUSAL_LINGER_BYTES)):
                await stream.reset()
            await stream.close()
        finally:
            stats.streams_in -= 1
            Admission.session_ended(probation)  # on probation: admitted by now, or closed

    def _peer_event(self, peer_id: str, *, connected: bool) -> None:
        self._stats.seen(peer_id, connected=connected, is_connected=self.is_connected)
        callback = self._on_connected if connected else self._on_disconnected
        if callback is None:
            return
        try:
            callback(peer_id)
        except Exception:
            logger.exception("peer %s callback failed", "connect" if connected else "disconnect")

    async def _close(self) -> None:
        with trio.CancelScope(shield=True, deadline=trio.current_time() + HOST_CLOSE_TIMEOUT_S):
            try:
                await self._host.close()
            except Exception:
                logger.exception("closing the libp2p host failed")


def _concrete_multiaddrs(candidates: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
    """The addresses libp2p advertises (identify): wildcards made concrete."""
    return [multiaddr.Multiaddr(a) for a in concrete_addrs([str(c) for c in candidates])]


@asynccontextmanager
async def open_transport(
    identity: IdentityKey,
    handler: StreamHandler,
    config: TransportConfig | None = None,
    *,
    on_connected: PeerCallback | None = None,
    on_disconnected: PeerCallback | None = None,
    admit: AdmitPeer | None = None,
    on_refused: PeerCallback | None = None,
) -> AsyncIterator[Transport]:
    """Run a host listening on ``config.listen_host:listen_port`` until the block exits.

    ``handler`` serves each inbound ``/peerd/cache/1.0.0`` stream; it may raise freely (the
    stream is reset, the host survives). On exit every connection is closed, so remotes
    see the connection end.

    ``admit`` (mend 8): whether an authenticated peer id may hold a connection that it
    opened (None: anyone). Another's connection is closed right after the handshake, or,
    while one of ``config.max_probation_connections`` slots is free, after its first
    session unless that session admitted it (a newcomer brings the manifest listing it).
    ``on_refused`` is told of each connection closed without a session.
    """
    cfg = config if config is not None else TransportConfig()
    if cfg.listen_port != 0:
        check_port_free(cfg.listen_host, cfg.listen_port)
    transport = Transport(identity, handler, cfg, on_connected, on_disconnected, admit,
                          on_refused)
    listen = multiaddr.Multiaddr(tcp_multiaddr(cfg.listen_host, cfg.listen_port))
    try:
        async with transport._host.run([listen]):
            if not transport._host.get_transport_addrs():
                # network.listen() reports failure (e.g. port in use) only by returning False.
                raise TransportError(f"could not listen on {listen}")
            async with trio.open_nursery() as tasks:
                transport._admission.tasks = tasks  # closes, probation timers (mend 8)
                tasks.start_soon(transport.liveness.sweep)  # mend 9
                try:
                    yield transport
                finally:
                    tasks.cancel_scope.cancel()
                    transport._admission.tasks = None
                    await transport._close()
    finally:
        # Also on a failed start: host.run() alone leaks the listener and connections (mend 2).
        await transport._close()
