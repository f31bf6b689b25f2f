"""The relay service: Circuit Relay v2 hop + a rendezvous point on one libp2p host (issue 27).

``peerd relay`` runs it on a host of its own (no fleet, no manifest, no cache, no training:
it forwards ciphertext and keeps a directory of addresses); a reachable member runs the same
on its gossip host with ``[network] relay_service = true``. NAT'd members reserve a slot
here, register their ``/p2p-circuit`` address under their fleet's namespace
(:func:`fleet_namespace`) and find each other by it; Noise runs end to end over the circuit,
so the relay sees only ciphertext and never holds an entry.

py-libp2p 0.8.1 provides both protocols (``CircuitV2Protocol(allow_hop=True)``,
``RendezvousService``); read from its source, what they bound and what they do not:

- the hop keeps one reservation per peer id, at most ``max_reservations`` of them, but it
  takes the reserved id from the request (``HopMessage.peer``), so one connection could
  fill the table with ids it does not hold; there is no per-IP cap (``HopConfig``'s
  per-IP, total and bandwidth fields, 1 MB/s per circuit among them, are declared and never
  read), and a reservation whose peer left holds its slot until its TTL;
- circuits: ``max_circuit_conns`` per *reserved destination*, none per source, none in
  total; a circuit's ``data`` budget is shared by both directions and its ``duration`` is
  checked between reads (the circuit is reset when either runs out); no rate limit;
- the rendezvous caps a namespace at 1,000 registrations but not the number of namespaces
  (a DISCOVER of an unknown namespace even creates an empty one), nor a peer's
  registrations across namespaces, nor the addresses in one (any number of 2 KiB ones
  within a 4 MiB message), and accepts TTLs up to 72 h.

:class:`_Hop` and :class:`_Rendezvous` add the missing bounds (:class:`RelayLimits`), each at
the library's own decision point (a subclass method), and :meth:`RelayService.run` sweeps
what the library only cleans when asked. It must not know what travels in a circuit.

The same host answers AutoNAT v1 dial-back requests (peerd.net.autonat), so the members
that reserve here can learn whether they need to (peerd.net.reachability).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.discovery.rendezvous.config import MAX_NAMESPACE_LENGTH, RENDEZVOUS_PROTOCOL
from libp2p.discovery.rendezvous.messages import (
    create_discover_response_message,
    create_register_response_message,
)
from libp2p.discovery.rendezvous.pb.rendezvous_pb2 import Message
from libp2p.discovery.rendezvous.service import RendezvousService
from libp2p.io.exceptions import IncompleteReadError, MessageTooLarge
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.resources import RelayLimits as LibraryRelayLimits
from libp2p.tools.anyio_service.context import background_trio_service
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

from peerd.net.autonat import AutoNATServer

logger = logging.getLogger(__name__)

#: Rendezvous namespaces this relay serves start with it; others are refused, so the point
#: is no open directory for whatever else speaks the protocol.
NAMESPACE_PREFIX = "peerd/"
#: How often expired reservations, reservations of peers that left, and expired
#: registrations are dropped (the library drops them only when a request needs room).
SWEEP_INTERVAL_S = 30.0

MIB = 1 << 20


def fleet_namespace(fleet_id: bytes) -> str:
    """The rendezvous namespace of a fleet (``peerd/<fleet id hex>``): members of other
    fleets register and look up under their own, so fleets sharing a relay never mix."""
    if not fleet_id:
        raise ValueError("a fleet id is needed")
    return f"{NAMESPACE_PREFIX}{fleet_id.hex()}"


@dataclass(frozen=True, slots=True)
class RelayLimits:
    """What one relay holds and forwards at most. Sized for model entries: one circuit
    carries a whole 44 MB entry (the largest in docs/benchmarks.md) several times over,
    Noise/Yamux framing and the session's other frames included."""

    #: Reservations held at once: the hop's table, one per peer id (ids cost nothing to mint).
    reservations: int = 128
    #: Reservations held at once by peers connected from one IP address: one host cannot
    #: take every slot with fresh keys. A whole site behind one NAT shares one address, so
    #: it is sized for a site's members, not for one host.
    reservations_per_ip: int = 32
    #: Circuits open at once, in all: each holds two streams and a task pair on the relay.
    circuits: int = 256
    #: Circuits open at once to one reserved peer (the library's ``max_circuit_conns``) and,
    #: added here, from one source peer: one peer cannot take every circuit. A member keeps
    #: up to ``[network] max_connections`` (16) connections, any of them relayed.
    circuits_per_peer: int = 16
    #: Bytes one circuit carries, both directions together (then it is reset; the member
    #: dials a new one): the relay's bandwidth is not one circuit's forever.
    circuit_bytes: int = 512 * MIB
    #: Seconds one circuit lasts (then reset), for the same reason.
    circuit_duration_s: int = 3600
    #: Seconds a reservation lasts unless refreshed: a member that vanished frees its slot.
    reservation_ttl_s: int = 3600
    #: Rendezvous registrations held at once, in all namespaces together.
    registrations: int = 4096
    #: Registrations one peer holds at once (one per namespace): a member of one fleet
    #: needs one; an id cannot be spread over many namespaces.
    registrations_per_peer: int = 4
    #: Registrations one namespace (one fleet) holds at once (the library's own is 1,000).
    registrations_per_namespace: int = 1000
    #: Longest registration TTL granted (longer asks are shortened): a member that vanished
    #: leaves the directory within it.
    registration_ttl_s: int = 7200
    #: Addresses one registration carries (a member's circuit addresses, one per relay).
    addrs_per_registration: int = 16
    #: Largest rendezvous message read (the library's own is 4 MiB).
    rendezvous_message_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for name in self.__slots__:
            if getattr(self, name) < 1:
                raise ValueError(f"RelayLimits.{name} must be at least 1")

    def library_limits(self) -> LibraryRelayLimits:
        """The hop's own limits object (the bounds it enforces itself)."""
        return LibraryRelayLimits(duration=self.circuit_duration_s, data=self.circuit_bytes,
                                  max_circuit_conns=self.circuits_per_peer,
                                  max_reservations=self.reservations,
                                  reservation_ttl=self.reservation_ttl_s)


#: The limits ``peerd relay`` and ``relay_service`` run with.
RELAY_LIMITS = RelayLimits()


@dataclass(slots=True)
class RelayStats:
    """What the service holds now and what it refused since start."""

    reservations: int = 0
    circuits: int = 0
    registrations: int = 0
    namespaces: int = 0
    refused_reservations: int = 0
    refused_circuits: int = 0
    refused_registrations: int = 0


def _remote_ip(stream: INetStream) -> str | None:
    # Yamux has it (py-libp2p 0.8.1); a relayed connection has none (the hop refuses those).
    try:
        remote = getattr(stream.muxed_conn, "get_remote_address", lambda: None)()
    except (AttributeError, OSError):
        return None
    return None if remote is None else str(remote[0])


class _Hop(CircuitV2Protocol):
    """The library's hop, with the bounds it lacks (module docstring): a reservation only
    for the id that holds the connection, reservations per IP, circuits in all and per
    source. Overrides the library's private handlers; the checks run before them."""

    def __init__(self, host: IHost, limits: RelayLimits, stats: RelayStats) -> None:
        super().__init__(host, limits=limits.library_limits(), allow_hop=True)
        self._ours = limits
        self._stats = stats
        #: IP each reservation was made from, for the per-IP cap; pruned to the library's
        #: table (at most ``limits.reservations`` entries).
        self._ip_of: dict[ID, str | None] = {}
        self._from_source: Counter[ID] = Counter()
        self._open = 0

    def reservation_table(self) -> dict[ID, Any]:
        table: dict[ID, Any] = self.resource_manager._reservations
        return table

    def circuit_count(self) -> int:
        return self._open

    def sweep(self) -> None:
        """Drop expired reservations and those of peers no longer connected (the spec: a
        reservation holds only while its peer's connection does)."""
        manager = self.resource_manager
        manager._clean_expired()
        table = self.reservation_table()
        for peer in [p for p in table if not manager._is_peer_connected(p)]:
            del table[peer]
        self._prune_ips()

    def _prune_ips(self) -> None:
        table = self.reservation_table()
        for peer in [p for p in self._ip_of if p not in table]:
            del self._ip_of[peer]

    async def _refuse(self, stream: INetStream, code: StatusCode, why: str) -> None:
        await self._send_status(stream, code, why)
        await trio.sleep(0.2)  # so the STATUS is read before the reset (as the library does)
        await stream.reset()

    async def _handle_reserve(self, stream: INetStream, msg: Any) -> None:
        remote = stream.muxed_conn.peer_id
        if msg.HasField("peer") and msg.peer.id and bytes(msg.peer.id) != remote.to_bytes():
            self._stats.refused_reservations += 1
            await self._refuse(stream, StatusCode.PERMISSION_DENIED,
                               "a peer reserves only for itself")
            return
        self.resource_manager._clean_expired()
        self._prune_ips()
        if remote not in self.reservation_table():
            ip = _remote_ip(stream)
            if sum(1 for p in self._ip_of.values() if p == ip) >= self._ours.reservations_per_ip:
                self._stats.refused_reservations += 1
                await self._refuse(stream, StatusCode.RESOURCE_LIMIT_EXCEEDED,
                                   "too many reservations from this address")
                return
            if len(self.reservation_table()) >= self._ours.reservations:
                self._stats.refused_reservations += 1  # the library refuses it below
            self._ip_of[remote] = ip
        await super()._handle_reserve(stream, msg)
        self._prune_ips()  # a refused one leaves no entry

    async def _handle_connect(self, stream: INetStream, msg: Any) -> None:
        source = stream.muxed_conn.peer_id
        if self._open >= self._ours.circuits:
            self._stats.refused_circuits += 1
            await self._refuse(stream, StatusCode.RESOURCE_LIMIT_EXCEEDED,
                               "the relay carries its most circuits")
            return
        if self._from_source[source] >= self._ours.circuits_per_peer:
            self._stats.refused_circuits += 1
            await self._refuse(stream, StatusCode.RESOURCE_LIMIT_EXCEEDED,
                               "too many circuits from this peer")
            return
        self._open += 1
        self._from_source[source] += 1
        try:
            await super()._handle_connect(stream, msg)
        finally:
            self._open -= 1
            self._from_source[source] -= 1
            if self._from_source[source] <= 0:
                del self._from_source[source]


class _Rendezvous(RendezvousService):
    """The library's rendezvous point, with the bounds it lacks (module docstring): our
    namespaces only, registrations in all and per peer, addresses per registration, a
    shorter TTL, no empty namespace kept, a smaller message."""

    def __init__(self, host: IHost, limits: RelayLimits, stats: RelayStats) -> None:
        super().__init__(host)  # registers the library's handler: replaced by ours
        host.set_stream_handler(RENDEZVOUS_PROTOCOL, self._handle_bounded_stream)
        self._ours = limits
        self._stats = stats

    def registration_count(self) -> int:
        return sum(len(r) for r in self.registrations.values())

    def _refused(self, status: Any, why: str) -> Message:
        self._stats.refused_registrations += 1
        return create_register_response_message(status, why)

    def _handle_register(self, peer_id: ID, register_msg: Any) -> Message:
        ns = register_msg.ns
        if not ns.startswith(NAMESPACE_PREFIX) or len(ns) > MAX_NAMESPACE_LENGTH:
            return self._refused(Message.ResponseStatus.E_INVALID_NAMESPACE,
                                 f"namespaces here start with {NAMESPACE_PREFIX}")
        if len(register_msg.peer.addrs) > self._ours.addrs_per_registration:
            return self._refused(Message.ResponseStatus.E_INVALID_PEER_INFO,
                                 "too many addresses")
        if register_msg.ttl > self._ours.registration_ttl_s:
            register_msg.ttl = self._ours.registration_ttl_s  # granted shorter (answered)
        held = self.registrations.get(ns, {})
        if peer_id not in held:  # a refresh replaces its record: no new room needed
            self.cleanup_all_expired()
            held = self.registrations.get(ns, {})
            mine = sum(1 for r in self.registrations.values() if peer_id in r)
            if mine >= self._ours.registrations_per_peer:
                return self._refused(Message.ResponseStatus.E_UNAVAILABLE,
                                     "too many registrations of this peer")
            if len(held) >= self._ours.registrations_per_namespace:
                return self._refused(Message.ResponseStatus.E_UNAVAILABLE,
                                     "this namespace is full")
            if self.registration_count() >= self._ours.registrations:
                return self._refused(Message.ResponseStatus.E_UNAVAILABLE,
                                     "the rendezvous point is full")
        response: Message = super()._handle_register(peer_id, register_msg)
        if response.registerResponse.status != Message.ResponseStatus.OK:
            self._stats.refused_registrations += 1
            if not self.registrations.get(ns):
                self.registrations.pop(ns, None)  # the library made it before refusing
        return response

    def _handle_unregister(self, peer_id: ID, unregister_msg: Any) -> None:
        super()._handle_unregister(peer_id, unregister_msg)
        if not self.registrations.get(unregister_msg.ns, True):
            del self.registrations[unregister_msg.ns]

    def _handle_discover(self, peer_id: ID, discover_msg: Any) -> Message:
        if discover_msg.ns and discover_msg.ns not in self.registrations:
            # The library would create (and keep) an empty namespace for any name asked.
            return create_discover_response_message([], b"", Message.ResponseStatus.OK, "OK")
        response: Message = super()._handle_discover(peer_id, discover_msg)
        if not self.registrations.get(discover_msg.ns, True):
            del self.registrations[discover_msg.ns]
        return response

    async def _handle_bounded_stream(self, stream: INetStream) -> None:
        """The library's ``_handle_stream`` with our message bound (its own is 4 MiB)."""
        peer_id = stream.muxed_conn.peer_id
        try:
            while True:
                try:
                    data = await read_varint_prefixed_bytes_limited(
                        stream, self._ours.rendezvous_message_bytes)
                except (MessageTooLarge, IncompleteReadError):
                    return
                request = Message()
                request.ParseFromString(data)
                response: Message | None = None
                if request.type == Message.REGISTER:
                    response = self._handle_register(peer_id, request.register)
                elif request.type == Message.UNREGISTER:
                    self._handle_unregister(peer_id, request.unregister)
                elif request.type == Message.DISCOVER:
                    response = self._handle_discover(peer_id, request.discover)
                else:
                    return
                if response is not None:
                    await stream.write(encode_varint_prefixed(response.SerializeToString()))
        except Exception as e:  # noqa: BLE001 - a peer's bytes must not end the host
            logger.info("rendezvous stream from %s failed: %r", peer_id, e)
        finally:
            try:
                await stream.close()
            except Exception as e:  # noqa: BLE001 - already torn down
                logger.debug("closing a rendezvous stream failed: %r", e)


class RelayService:
    """Circuit Relay v2 hop + rendezvous point on ``host``; serves while :meth:`run` runs
    (or inside :func:`serve_relay`)."""

    def __init__(self, host: IHost, limits: RelayLimits = RELAY_LIMITS) -> None:
        self.host = host
        self.limits = limits
        self._stats = RelayStats()
        #: The hop's protocol instance; it also serves ``/stop`` on this host, so a member
        #: running the service can hand it to its relay client instead of a second one.
        self.hop = _Hop(host, limits, self._stats)
        self._rendezvous: _Rendezvous | None = None
        #: Dial-backs for members asking whether they need a relay at all.
        self.autonat = AutoNATServer(host)

    def stats(self) -> RelayStats:
        s = self._stats
        s.reservations = len(self.hop.reservation_table())
        s.circuits = self.hop.circuit_count()
        rdv = self._rendezvous
        s.registrations = rdv.registration_count() if rdv is not None else 0
        s.namespaces = len(rdv.registrations) if rdv is not None else 0
        return replace(s)

    def sweep(self) -> None:
        self.hop.sweep()
        if self._rendezvous is not None:
            self._rendezvous.cleanup_all_expired()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Serve until cancelled; ``task_status.started()`` once both protocols answer."""
        self._rendezvous = _Rendezvous(self.host, self.limits, self._stats)
        self.autonat.install()
        try:
            async with background_trio_service(self.hop):
                await self.hop.event_started.wait()
                task_status.started()
                while True:
                    await trio.sleep(SWEEP_INTERVAL_S)
                    self.sweep()
        finally:
            self.autonat.remove()
            self.host.remove_stream_handler(RENDEZVOUS_PROTOCOL)
            self._rendezvous = None


@asynccontextmanager
async def serve_relay(host: IHost, limits: RelayLimits = RELAY_LIMITS
                      ) -> AsyncIterator[RelayService]:
    """Run a :class:`RelayService` on ``host`` (a :attr:`peerd.net.transport.Transport.host`)
    for the duration of the block."""
    service = RelayService(host, limits)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        try:
            yield service
        finally:
            nursery.cancel_scope.cancel()
