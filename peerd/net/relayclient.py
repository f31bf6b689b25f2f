"""A member's side of Circuit Relay v2 (issue 27, item 2): ``[network] relays``, and the
relays learned by address exchange.

For each relay, configured (a ``peerd relay``, a member with ``relay_service``, or any
libp2p Circuit Relay v2 relay) or learned (:meth:`RelayClient.set_learned`: members whose
signed record says they run a relay service, ``peerd.node.relaylearn``; added and dropped
while the client runs), this node keeps a **reservation**: it dials the relay, sends the
hop protocol's RESERVE, and sends it again when half of what the relay granted has gone, or
at once when the connection to the relay is lost; a relay that cannot be reached or refuses
is retried with a jittered, doubling backoff. A relay named by DNS (``/dns4|dns6|dns/…``)
is resolved each time it is dialled (``peerd.net.bootstrap.resolve_addr``, bounded). While
a reservation is held, the node can be
dialled at its **circuit address** ``<relay's TCP address>/p2p/<relay id>/p2p-circuit``:
:meth:`RelayClient.circuit_addrs` gives them to the address record
(``peerd.node.addrbook``), so the sessions' address exchange spreads them, and they are
registered at the relay's **rendezvous point** under the fleet's namespace
(:func:`rendezvous_namespace`), where the node also asks, every ``discover_interval_s``,
which other members registered: what it learns there is a hint like an mDNS record (bounded,
members only, and the Noise handshake proves the id when it is dialled).

**Dialling** (:meth:`RelayClient.connect`, :mod:`peerd.net.relaydial`): direct addresses
first and, after their head start, the circuits beside them, those through relays where we
hold a reservation first, through py-libp2p's ``CircuitV2Transport.dial`` (``host.connect``
dials TCP only). Noise and Yamux run end to end over the relayed stream: the relay carries
ciphertext.

**Accepting**: the host runs the protocol's STOP side (``CircuitV2Protocol`` without hop), so
relays can hand it circuits. A relayed connection is an inbound connection of the swarm like
any other, so the transport's admission (``peerd.net.admission``) screens it the same way: a
non-member's circuit is closed right after its handshake.

The rendezvous requests are ``peerd.net.rendezvousclient``'s; a relay that runs no
rendezvous point (js-libp2p's) is asked nothing more until the connection to it is made
again.

It must not decide who is a member (``is_member`` is the caller's) nor touch the peer table
(``on_found`` and ``on_reserved``, a reservation held anew, are the caller's); it reports its
state through :meth:`RelayClient.states` and :meth:`RelayClient.relayed_via`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace

import trio
from libp2p.connection_types import ConnectionType
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeerId
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg
from libp2p.tools.anyio_service.context import background_trio_service

from peerd.net import relaydial, rendezvousclient
from peerd.net.bootstrap import resolve_addr
from peerd.net.relay import fleet_namespace
from peerd.net.relaydial import circuit_relay, rank_circuits
from peerd.net.rendezvousclient import RendezvousError
from peerd.net.transport import Transport, TransportError
from peerd.protocol.limits import MAX_RECORD_ADDRS
from peerd.protocol.peerrecord import is_circuit

logger = logging.getLogger(__name__)

#: Deadline of one reservation (dial the relay if need be, RESERVE, its answer).
RESERVE_TIMEOUT_S = 10.0
#: Backoff between attempts at a relay that is gone or refuses (jittered, doubling).
RETRY_MIN_S, RETRY_MAX_S = 1.0, 60.0
#: For this long after a held reservation is lost, a relay is retried every RETRY_MIN_S
#: (jittered) before the backoff doubles: a relay that restarts is back within seconds, and
#: a doubled backoff had members wait up to 4 s more once it served again. A relay gone for
#: good costs about as many refused dials, then the backoff grows as before.
RETRY_FAST_S = 20.0
#: How often the connection to a relay is looked at between refreshes: a relay that
#: restarted lost our reservation with the connection, so we reserve again at once.
WATCH_S = 1.0
#: The longest a reservation goes unrefreshed, whatever the relay granted. js-libp2p's relay
#: (circuit-relay-v2 4.2.13) deletes a reservation refreshed twice at its *first* refresh's
#: time + TTL (a timer its reset leaves behind; tests/net/test_js_relay.py shows it): with
#: its 2 h default and a refresh at half, a member would be undialable there for up to an
#: hour; this bounds that window to 10 min, for one RESERVE per relay per 10 min.
REFRESH_MAX_S = 600.0
#: Seconds between DISCOVER requests at each relay's rendezvous point.
DISCOVER_INTERVAL_S = 30.0
#: Circuit addresses of one peer tried per dial: a peer registers at most a few relays.
MAX_CIRCUIT_DIALS = 4
#: Peers remembered as reached through a circuit at their last dial (their next dial gives
#: the direct addresses no head start); the oldest is forgotten beyond this.
MAX_RELAYED_LAST = 1024
#: The limits our STOP side states (it relays nothing: the hop enforces its own limits).
_STOP_LIMITS = RelayLimits(duration=3600, data=1 << 30, max_circuit_conns=16,
                           max_reservations=0)


#: What :meth:`RelayClient.relayed_via` says of a relayed connection whose relay it cannot tell.
UNKNOWN_RELAY = "?"


def rendezvous_namespace(fleet_id: bytes) -> str:
    """The namespace a fleet's members register under at a rendezvous point: one relay can
    serve several fleets, each finding only its own (the relay side's, ``peerd/<hex>``)."""
    return fleet_namespace(fleet_id)


def split_relay(addr: str) -> tuple[str, str]:
    """``/ip4/HOST/tcp/PORT/p2p/ID`` → (``/ip4/HOST/tcp/PORT``, ``ID``)."""
    head, _, relay_id = addr.rpartition("/p2p/")
    return head, relay_id


class RelayError(Exception):
    """A relay that cannot be reached, refused, or answered something we cannot use."""


@dataclass(slots=True)
class RelayState:
    """One relay as the client sees it (for ``peerd status``)."""

    addr: str  #: as configured (or learned), ``…/p2p/<relay id>``
    relay_id: str
    #: Learned by address exchange (``set_learned``), not from ``[network] relays``.
    learned: bool = False
    #: The address it was last dialled at (a DNS name resolved); None before.
    dialled: str | None = None
    #: Unix time the held reservation ends; None while none is held.
    reserved_until: float | None = None
    reservations: int = 0  #: RESERVE answered OK (first ones and refreshes)
    failures: int = 0  #: attempts that failed (unreachable, refused, lost)
    last_error: str | None = None
    registered: bool = False  #: our circuits registered at its rendezvous point
    #: Whether it runs a rendezvous point: None until it answered or refused since we last
    #: connected to it, False while it said it runs none (then it is asked nothing).
    rendezvous: bool | None = None
    found: int = 0  #: members taken from its last DISCOVER answer

    @property
    def circuit(self) -> str:
        """Our circuit address at this relay (peers append ``/p2p/<our id>``)."""
        head, relay_id = split_relay(self.addr)
        return f"{self.dialled or head}/p2p/{relay_id}/p2p-circuit"


#: ``on_found(node_id, addrs)``: a member registered at a rendezvous point, its addresses.
OnFound = Callable[[str, tuple[str, ...]], None]


class RelayClient:
    """Reservations on ``relays``, their circuit addresses, rendezvous, relayed dials."""

    def __init__(self, transport: Transport, relays: Sequence[str], fleet_id: bytes, *,
                 is_member: Callable[[str], bool], on_found: OnFound,
                 on_change: Callable[[], None] | None = None,
                 on_reserved: Callable[[str], object] | None = None,
                 clock: Callable[[], float] = time.time,
                 discover_interval_s: float = DISCOVER_INTERVAL_S,
                 retry_max_s: float = RETRY_MAX_S,
                 rng: random.Random | None = None,
                 needs_reservation: Callable[[], bool] = lambda: True) -> None:
        self._transport = transport
        self._states = [RelayState(a, split_relay(a)[1]) for a in dict.fromkeys(relays)]
        self._configured = frozenset(s.relay_id for s in self._states)
        #: Each relay's task while the client runs (by address): cancelled when dropped.
        self._scopes: dict[str, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        self.namespace = rendezvous_namespace(fleet_id)
        self._is_member = is_member
        self._on_found = on_found
        self._on_change = on_change
        self._on_reserved = on_reserved
        self._clock = clock
        self._discover_interval_s = discover_interval_s
        self._retry_max_s = retry_max_s
        self._rng = rng if rng is not None else random.Random()
        self._dialer: CircuitV2Transport | None = None
        #: Peers our last dial reached through a circuit (insertion order: oldest first).
        self._relayed_last: dict[str, None] = {}
        #: The circuits each relay's rendezvous point holds for us (by relay id).
        self._registered: dict[str, tuple[str, ...]] = {}
        self.started = trio.Event()
        #: Reachability (peerd.net.reachability): False while this node is publicly dialable;
        #: then no reservation is made or refreshed, rendezvous DISCOVER goes on.
        self._needs_reservation = needs_reservation

    # ------------------------------------------------------------------ what others read
    def states(self) -> list[RelayState]:
        """A copy of each relay's state: the configured ones in order, then the learned."""
        return [replace(s) for s in self._states]

    def set_learned(self, relays: Sequence[str]) -> bool:
        """Use these learned relays (``…/p2p/<id>``) beside the configured ones from now on:
        a new one is reserved on at once, one no longer named is let go (its task ended,
        its circuit gone from :meth:`circuit_addrs`). A configured relay or this node is
        never taken as learned. Whether anything changed."""
        own = self._transport.peer_id
        want = [a for a in dict.fromkeys(relays)
                if split_relay(a)[1] not in self._configured and split_relay(a)[1] != own]
        have = {s.addr: s for s in self._states if s.learned}
        if list(have) == want:
            return False
        for addr, st in have.items():
            if addr in want:
                continue
            self._states.remove(st)
            self._registered.pop(st.relay_id, None)
            scope = self._scopes.pop(addr, None)
            if scope is not None:
                scope.cancel()
            logger.info("relay %s: no longer a learned relay", addr)
        for addr in want:
            if addr not in have:
                st = RelayState(addr, split_relay(addr)[1], learned=True)
                self._states.append(st)
                logger.info("relay %s: learned by address exchange", addr)
                if self._nursery is not None:
                    self._nursery.start_soon(self._run_one, st)
        self._changed()  # our record and registrations follow the circuits held
        return True

    def circuit_addrs(self) -> tuple[str, ...]:
        """Our circuit addresses at the relays where a reservation is held now."""
        now = self._clock()
        return tuple(s.circuit for s in self._states
                     if s.reserved_until is not None and s.reserved_until > now)

    def relayed_via(self, peer_id: str) -> str | None:
        """The id of the relay our connection with ``peer_id`` runs through
        (:data:`UNKNOWN_RELAY` for a circuit the peer opened: py-libp2p's STOP side names
        the host itself as its relay); None when a direct one is open, or none is (for
        ``peerd peers``' path)."""
        try:
            conns = self._transport.host.get_network().connections.get(
                ID.from_base58(peer_id), [])
        except ValueError:
            return None
        own = self._transport.peer_id
        via: str | None = None
        for conn in conns:
            try:
                relayed = conn.get_connection_type() == ConnectionType.RELAYED
                addrs = [str(a) for a in conn.get_transport_addresses()]
            except Exception:  # noqa: BLE001, S112 - a torn connection says nothing
                continue
            if not relayed:
                return None  # a direct connection is there: that is the path used
            circuit = next((a for a in addrs if "/p2p-circuit" in a), "")
            relay = circuit_relay(circuit)
            via = relay if relay and relay != own else via or UNKNOWN_RELAY
        return via

    # ------------------------------------------------------------------ running
    async def run(self, protocol: CircuitV2Protocol | None = None) -> None:
        """The STOP side and one task per relay, for as long as the caller's scope runs.
        ``protocol``: a running instance on this host that serves ``/stop`` already (the
        hop of ``[network] relay_service``, peerd.net.relay): used instead of a second one,
        which would take over its handler and remove it on exit."""
        host = self._transport.host
        async with AsyncExitStack() as stack:
            stop = protocol
            if stop is None:
                stop = CircuitV2Protocol(host, limits=_STOP_LIMITS, allow_hop=False)
                await stack.enter_async_context(background_trio_service(stop))
                await stop.event_started.wait()
            nursery = await stack.enter_async_context(trio.open_nursery())
            # STOP only: a dial must not make a reservation (ours are kept by _keep).
            self._dialer = CircuitV2Transport(host, stop, RelayConfig(roles=RelayRole.STOP,
                                                                      limits=_STOP_LIMITS))
            self._nursery = nursery
            self.started.set()
            for state in self._states:
                nursery.start_soon(self._run_one, state)
            try:  # open for relays learned later, with none to start with too
                await trio.sleep_forever()
            finally:
                self._nursery = None

    async def _run_one(self, st: RelayState) -> None:
        """One relay's task, cancelled when :meth:`set_learned` lets the relay go."""
        with trio.CancelScope() as scope:
            self._scopes[st.addr] = scope
            try:
                await self._keep(st)
            finally:
                if self._scopes.get(st.addr) is scope:
                    del self._scopes[st.addr]

    async def _keep(self, st: RelayState) -> None:
        backoff = RETRY_MIN_S
        lost_at = -RETRY_FAST_S  # trio time a held reservation was lost
        while True:
            try:
                if not self._needs_reservation():
                    await self._unreserved(st)
                    continue
                await self._reserve(st)
                backoff = RETRY_MIN_S
                await self._register(st)
                await self._hold(st)  # returns when the reservation is due for a refresh
            except RelayError as exc:
                had = st.reserved_until is not None
                st.reserved_until, st.registered = None, False
                st.failures += 1
                st.last_error = str(exc)
                logger.log(logging.WARNING if had or st.failures == 1 else logging.DEBUG,
                           "relay %s: %s (retrying in about %.0f s)", st.addr, exc, backoff)
                if had:
                    lost_at = trio.current_time()
                    self._changed()
                await trio.sleep(backoff * self._rng.uniform(0.5, 1.0))
                if trio.current_time() - lost_at >= RETRY_FAST_S:
                    backoff = min(backoff * 2, self._retry_max_s)

    async def _reserve(self, st: RelayState) -> None:
        t, pid = self._transport, ID.from_base58(st.relay_id)
        try:
            with trio.fail_after(RESERVE_TIMEOUT_S):
                await self._connect(st)
                stream = await t.host.new_stream(pid, [HOP_PROTOCOL_ID])
                try:
                    await write_delimited_msg(stream, HopMessage(
                        type=HopMessage.RESERVE,
                        peer=CircuitPeerId(id=t.host.get_id().to_bytes())))
                    resp = await read_delimited_msg(stream, HopMessage)
                finally:
                    await stream.close()
        except trio.TooSlowError:
            raise RelayError("reservation timed out") from None
        except TransportError as exc:
            raise RelayError(f"unreachable: {exc}") from None
        except OSError as exc:
            raise RelayError(f"cannot resolve: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - py-libp2p's streams raise many types
            raise RelayError(f"reservation failed: {exc!r}") from None
        status = StatusCode(resp.status) if resp.HasField("status") else StatusCode.OK
        if status != StatusCode.OK:
            raise RelayError(f"reservation refused ({status.name})")
        expires = float(resp.reservation.expire) if resp.HasField("reservation") else 0.0
        if expires <= self._clock():
            raise RelayError("reservation granted without a future expiry")
        fresh = st.reserved_until is None
        st.reserved_until = expires
        st.reservations += 1
        st.last_error = None
        if fresh:
            logger.info("relay %s: reservation held (dialable at %s)", st.addr, st.circuit)
            if self._on_reserved is not None:
                self._on_reserved(st.relay_id)
            self._changed()

    async def _hold(self, st: RelayState) -> None:
        """Until the refresh is due (half of the reservation's time left when granted, at most
        REFRESH_MAX_S):
        DISCOVER every ``discover_interval_s``; a lost connection ends the hold with an
        error, so the reservation is made again at once (the relay may have restarted)."""
        assert st.reserved_until is not None
        now = self._clock()
        refresh_at = now + min((st.reserved_until - now) / 2, REFRESH_MAX_S)
        next_discover = now
        while True:
            if not self._transport.is_connected(st.relay_id):
                raise RelayError("connection to the relay lost")
            now = self._clock()
            if now >= refresh_at or not self._needs_reservation():
                return
            if st.registered and self._registered.get(st.relay_id) != self._circuits():
                # A reservation elsewhere was lost or made: the registration says so, so
                # that members finding us here do not dial a dead relay's circuit first.
                await self._register(st)
            if now >= next_discover:
                await self._discover(st)
                next_discover = self._clock() + self._discover_interval_s
            await trio.sleep(max(0.0, min(WATCH_S, refresh_at - now,
                                          next_discover - self._clock())))

    async def _unreserved(self, st: RelayState) -> None:
        """While no reservation is needed (reachability): drop the one held (its circuit
        leaves our address record; the relay frees it at its TTL), keep the connection and
        DISCOVER, so NAT'd members registered there are still found and dialled."""
        if st.reserved_until is not None:
            st.reserved_until, st.registered = None, False
            logger.info("relay %s: no reservation needed (publicly reachable)", st.addr)
            self._changed()
        next_discover = self._clock()
        while not self._needs_reservation():
            if not self._transport.is_connected(st.relay_id):
                try:
                    await self._connect(st)
                except (TransportError, OSError, trio.TooSlowError) as exc:
                    raise RelayError(f"unreachable: {exc or 'timed out'}") from None
            if self._clock() >= next_discover:
                await self._discover(st)
                next_discover = self._clock() + self._discover_interval_s
            await trio.sleep(WATCH_S)

    async def _connect(self, st: RelayState) -> None:
        """A connection to the relay: its name resolved (OSError, trio.TooSlowError when it
        is not), then dialled unless one is open (TransportError)."""
        head, relay_id = split_relay(st.addr)
        addrs = await resolve_addr(head)
        st.dialled = addrs[0]
        if not self._transport.is_connected(relay_id):
            await self._transport.connect(relay_id, list(addrs), timeout_s=RESERVE_TIMEOUT_S)
            st.rendezvous = None  # a new connection: perhaps another build of the relay

    # ------------------------------------------------------------------ rendezvous
    async def _register(self, st: RelayState) -> None:
        """Our circuit addresses (at every relay holding one now) under the namespace. A
        relay without a rendezvous point still relays: a failure here is only logged."""
        if st.rendezvous is False:
            return
        circuits = self._circuits()
        try:
            ok, why = await rendezvousclient.register(self._transport.host, st.relay_id,
                                                      self.namespace, circuits)
        except RendezvousError as exc:
            self._no_answer(st, exc)
            st.registered = False
            return
        st.rendezvous = True
        if not ok and st.registered is not False:
            logger.info("relay %s: rendezvous registration refused (%s)", st.addr, why)
        st.registered = ok
        if ok:
            self._registered[st.relay_id] = circuits

    def _circuits(self) -> tuple[str, ...]:
        """What a registration lists: our circuits that a record could hold."""
        return self.circuit_addrs()[:MAX_RECORD_ADDRS]

    async def _discover(self, st: RelayState) -> None:
        if st.rendezvous is False:
            return
        try:
            found = await rendezvousclient.discover(
                self._transport.host, st.relay_id, self.namespace, self._transport.peer_id,
                self._is_member)
        except RendezvousError as exc:
            self._no_answer(st, exc)
            return
        st.rendezvous = True
        for node_id, addrs in found:
            self._on_found(node_id, addrs)
        st.found = len(found)

    def _no_answer(self, st: RelayState, exc: RendezvousError) -> None:
        if exc.unsupported:
            # Asking again every DISCOVER_INTERVAL_S would only log the library's error line
            # each time: asked again once the relay is connected anew (it may be another
            # build after a restart).
            st.rendezvous = False
            logger.info("relay %s: no rendezvous point there; members are found through "
                        "address exchange only", st.addr)
        else:
            logger.debug("relay %s: %s", st.addr, exc)

    # ------------------------------------------------------------------ dialling
    async def connect(self, peer_id: str, addrs: Sequence[str]) -> None:
        """Ensure a connection to ``peer_id``: an open one, else its direct addresses and its
        circuits, those through relays where we hold a reservation first
        (:func:`peerd.net.relaydial.dial`). TransportError when none worked."""
        t = self._transport
        if t.is_connected(peer_id):
            return
        circuits = rank_circuits([a for a in addrs if is_circuit(a)], self._held(),
                                 {s.relay_id for s in self._states})
        # A peer our last dial reached only through a circuit gets no head start for its
        # direct addresses: they were another site's, and will most likely fail again.
        relayed = await relaydial.dial(
            t, self._dialer, peer_id, [a for a in addrs if not is_circuit(a)],
            circuits[:MAX_CIRCUIT_DIALS], self._held,
            0.0 if peer_id in self._relayed_last else None)
        self._relayed_last.pop(peer_id, None)
        if relayed:
            self._relayed_last[peer_id] = None
            while len(self._relayed_last) > MAX_RELAYED_LAST:
                del self._relayed_last[next(iter(self._relayed_last))]

    def _held(self) -> set[str]:
        """The relays where a reservation is held now."""
        now = self._clock()
        return {s.relay_id for s in self._states
                if s.reserved_until is not None and s.reserved_until > now}

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

