"""mDNS/DNS-SD discovery of fleet peers on the LAN (python-zeroconf), bridged into trio.

We advertise ``<node id>._peerd._tcp.local.`` with TXT records ``id`` (libp2p peer id),
``fleet``, ``pv`` (protocol version) and ``port`` and browse for the same type. Records of
other fleets and our own are ignored; the rest are reported as :class:`PeerHint` to a
callback running in the trio thread. The TXT record's format and validation are
:mod:`peerd.net.txtrecord`'s.

Discovery is only a hint: anyone on the LAN can publish any TXT record. The transport's
Noise handshake proves the node id, the fleet manifest proves membership. Records from the
network are therefore parsed as hostile input: anything malformed is dropped and counted
in :attr:`Discovery.rejected`, never raised. A record whose id the caller's ``is_member``
refuses is ignored too (``not_member``), before it takes one of the tracked names, so a
LAN full of made-up ids cannot crowd out a member; :meth:`Discovery.recheck` looks at
those records again once the membership changed. A goodbye (or an expired record) is
passed on to ``on_peer_lost``. It must not dial or keep a peer list: hints go to the
caller's callbacks, and the daemon's :mod:`peerd.node.peers` table decides whom to dial.

zeroconf runs its own asyncio loop in a thread; its browser callbacks run in yet another
thread, and hop into trio with ``trio.from_thread.run_sync(..., trio_token=...)``.

The advertised addresses follow the host's while discovery runs (:mod:`peerd.net.announce`),
so peers stop dialling a dead address without waiting for a restart.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import ifaddr
import trio
from zeroconf import (
    EventLoopBlocked,
    InterfaceChoice,
    IPVersion,
    NonUniqueNameException,
    ServiceBrowser,
    ServiceInfo,
    ServiceStateChange,
    Zeroconf,
)

from peerd.net.addrs import ADDRESS_POLL_S, host_ips
from peerd.net.announce import follow_addresses
from peerd.net.txtrecord import MalformedRecordError, build_txt, parse_txt

logger = logging.getLogger(__name__)

SERVICE_TYPE = "_peerd._tcp.local."

_T = TypeVar("_T")

#: Addresses taken from one record: a hostile record listing hundreds would make us dial
#: hundreds of addresses for one hint.
MAX_ADDRESSES_PER_PEER = 8
#: Service names tracked at once; a LAN flooding names cannot grow our memory unbounded.
MAX_TRACKED_SERVICES = 1024
#: Resolving one service (SRV/TXT/A) in zeroconf's browser thread; a record that never
#: resolves must not stall the handling of the others for long.
RESOLVE_TIMEOUT_MS = 3000
#: A record that does not resolve (a lost packet on a busy LAN) is tried again this many
#: times in all, after RESOLVE_RETRY_S, then twice that, ... (in timer threads, so the
#: browser thread is never held longer than one timeout).
RESOLVE_ATTEMPTS = 4
RESOLVE_RETRY_S = 2.0
#: Goodbye packets and closing sockets at shutdown; a wedged zeroconf thread is abandoned.
STOP_TIMEOUT_S = 5.0

class DiscoveryError(Exception):
    """Discovery could not start (bad interface, sockets unavailable)."""


@dataclass(frozen=True)
class PeerHint:
    """A peer seen on the LAN (unauthenticated until the transport handshake)."""

    node_id: str
    fleet_id: str
    protocol_version: int
    addresses: tuple[str, ...]
    port: int

    @property
    def multiaddrs(self) -> list[str]:
        return [
            f"/{'ip6' if ':' in a else 'ip4'}/{a}/tcp/{self.port}" for a in self.addresses
        ]


def resolve_interfaces(interfaces: Sequence[str]) -> list[str]:
    """IPv4 addresses for interface names (``eth0``) or literal addresses."""
    adapters = {a.nice_name: a for a in ifaddr.get_adapters()}
    addrs: list[str] = []
    for item in interfaces:
        adapter = adapters.get(item)
        if adapter is None:
            if item.count(".") == 3:  # an IPv4 literal
                addrs.append(item)
                continue
            raise DiscoveryError(f"no such interface: {item!r}")
        found = [str(ip.ip) for ip in adapter.ips if ip.is_IPv4]
        if not found:
            raise DiscoveryError(f"interface {item!r} has no IPv4 address")
        addrs.extend(found)
    return list(dict.fromkeys(addrs))


def _published(interfaces: Sequence[str] | None) -> list[str]:
    """The IPv4 addresses to advertise now: the named interfaces' (their addresses are read
    again each time) or, for all interfaces, the host's non-loopback ones."""
    return resolve_interfaces(interfaces) if interfaces else list(host_ips(4))


def _published_now(interfaces: Sequence[str] | None) -> list[str]:
    try:
        return _published(interfaces)
    except DiscoveryError:  # a named interface gone or without an address for now
        return []


PeerCallback = Callable[[PeerHint], None]
LostCallback = Callable[[str], None]
#: Whether a node id may be a member; runs in the trio thread (it reads the node's manifest).
MemberCheck = Callable[[str], bool]


class Discovery:
    """The browser side; obtain a running one from :func:`open_discovery`."""

    def __init__(
        self,
        *,
        node_id: str,
        fleet_id: str,
        on_peer: PeerCallback,
        trio_token: trio.lowlevel.TrioToken,
        on_peer_lost: LostCallback | None = None,
        is_member: MemberCheck | None = None,
    ) -> None:
        self.node_id = node_id
        self.fleet_id = fleet_id
        self._on_peer = on_peer
        self._on_peer_lost = on_peer_lost
        self._is_member = is_member
        self._token = trio_token
        self._lock = threading.Lock()  # counters and the name maps are touched from threads
        self.rejected: Counter[str] = Counter()
        #: Service names of the fleet's records we track -> the node id each one reported.
        self._names: dict[str, str] = {}
        #: Names ignored as not_member, oldest first, for recheck(); as bounded as _names.
        self._ignored: dict[str, None] = {}
        self._zc: Zeroconf | None = None  # set once running (recheck resolves through it)
        #: The addresses in our A records now, and how often they were announced afresh.
        self.advertised: tuple[str, ...] = ()
        self.reannounced = 0

    def _readvertised(self, addresses: tuple[str, ...]) -> None:
        self.advertised = addresses
        self.reannounced += 1

    def _count(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] += 1

    # -- zeroconf's browser thread --

    def _on_state_change(
        self,
        zeroconf: Zeroconf,
        service_type: str,
        name: str,
        state_change: ServiceStateChange,
    ) -> None:
        try:
            if state_change is ServiceStateChange.Removed:
                # Goodbye or expiry: the slot is free again, and the caller forgets the peer
                # rather than dialling a dead address until it ages out.
                with self._lock:
                    self._ignored.pop(name, None)
                    lost = self._untrack(name)
                if lost is not None:
                    self._to_trio(self._lost, lost)
                return
            self._resolve(zeroconf, service_type, name, 0)
        except Exception:
            # Whatever the network sent, the browser thread must live on.
            self._count("error")
            logger.exception("mDNS record %r could not be handled", name)

    def _resolve(self, zeroconf: Zeroconf, service_type: str, name: str, attempt: int) -> None:
        try:
            info = zeroconf.get_service_info(service_type, name, timeout=RESOLVE_TIMEOUT_MS)
        except Exception:  # zeroconf closed while a retry was pending: nothing to do
            logger.debug("resolving %r failed", name, exc_info=True)
            return
        if info is not None:
            self.handle_info(name, info)
            return
        if attempt + 1 >= RESOLVE_ATTEMPTS:
            self._count("unresolved")
            return
        timer = threading.Timer(RESOLVE_RETRY_S * 2**attempt, self._resolve,
                                (zeroconf, service_type, name, attempt + 1))
        timer.daemon = True  # a pending retry never holds up shutdown
        timer.start()

    def handle_info(self, name: str, info: ServiceInfo) -> None:
        """Validate one resolved record and report it (called in zeroconf's thread)."""
        try:
            fields = parse_txt(info.properties)  # zeroconf decodes the TXT lazily, here
        except MalformedRecordError as e:
            self._count(e.reason)
            logger.debug("ignoring mDNS record %r: %s", name, e.reason)
            return
        # zeroconf's lazy TXT decoder raises no documented type; a hostile record must not kill
        # zeroconf's listener thread.
        except Exception:  # noqa: BLE001
            self._count("bad_txt")  # the TXT wire data itself did not decode
            return
        if fields.node_id == self.node_id:
            self._count("own_record")
            return
        if fields.fleet_id != self.fleet_id:
            self._count("other_fleet")
            return
        addresses = tuple(info.parsed_addresses(IPVersion.V4Only)[:MAX_ADDRESSES_PER_PEER])
        if not addresses:
            self._count("no_address")
            return
        if not self._member(fields.node_id):
            with self._lock:
                self.rejected["not_member"] += 1
                self._ignored.pop(name, None)  # re-inserted as the newest
                self._ignored[name] = None
                while len(self._ignored) > MAX_TRACKED_SERVICES:
                    del self._ignored[next(iter(self._ignored))]
                # A tracked record that now names a non-member (revoked, or re-registered
                # under another id) is a peer lost.
                lost = self._untrack(name)
            if lost is not None:
                self._to_trio(self._lost, lost)
            return
        with self._lock:
            if name not in self._names and len(self._names) >= MAX_TRACKED_SERVICES:
                self.rejected["too_many_services"] += 1
                return
            self._ignored.pop(name, None)
            before = self._names.get(name)
            self._names[name] = fields.node_id
            lost = self._untrack_id(before) if before not in (None, fields.node_id) else None
        if lost is not None:
            self._to_trio(self._lost, lost)
        hint = PeerHint(
            fields.node_id, fields.fleet_id, fields.protocol_version, addresses, fields.port
        )
        self._to_trio(self._on_peer, hint)

    def _untrack(self, name: str) -> str | None:
        """Forget ``name`` (lock held); the node id it reported if no other tracked name
        still reports it: a record that copies a member's id and then says goodbye does
        not make us forget the member."""
        return self._untrack_id(self._names.pop(name, None))

    def _untrack_id(self, node_id: str | None) -> str | None:
        if node_id is None or node_id in self._names.values():
            return None
        return node_id

    def _lost(self, node_id: str) -> None:
        if self._on_peer_lost is not None:
            self._on_peer_lost(node_id)

    def _member(self, node_id: str) -> bool:
        """``is_member`` asked in the trio thread (False once trio is gone)."""
        if self._is_member is None:
            return True
        try:
            return bool(trio.from_thread.run_sync(self._is_member, node_id,
                                                  trio_token=self._token))
        except trio.RunFinishedError:
            return False  # shutting down

    def recheck(self) -> None:
        """The membership changed (a newer manifest): resolve the records ignored as
        ``not_member`` again, so a newly admitted node is found without waiting for its
        record to change. In a thread of its own, one record after another (from
        zeroconf's cache, so mostly without a query)."""
        zc = self._zc
        with self._lock:
            names = list(self._ignored)
        if zc is None or not names:
            return
        thread = threading.Thread(target=self._recheck, args=(zc, names),
                                  name="peerd-mdns-recheck", daemon=True)
        thread.start()

    def _recheck(self, zc: Zeroconf, names: list[str]) -> None:
        for name in names:
            try:
                info = zc.get_service_info(SERVICE_TYPE, name, timeout=RESOLVE_TIMEOUT_MS)
            except Exception:  # zeroconf closed meanwhile: nothing left to do
                logger.debug("rechecking %r failed", name, exc_info=True)
                return
            if info is not None:
                self.handle_info(name, info)

    def _to_trio(self, fn: Callable[[_T], None], arg: _T) -> None:
        try:
            trio.from_thread.run_sync(fn, arg, trio_token=self._token)
        except trio.RunFinishedError:
            pass  # trio is gone: we are shutting down
        except Exception:
            logger.exception("discovery callback failed")


def _start(
    node_id: str,
    fleet_id: str,
    port: int,
    protocol_version: int,
    interfaces: Sequence[str] | None,
    discovery: Discovery,
) -> tuple[Zeroconf, ServiceBrowser, ServiceInfo]:
    # Blocking: runs in a worker thread.
    published = _published(interfaces)
    choice: list[str | int] | InterfaceChoice = (
        list(published) if interfaces else InterfaceChoice.All)
    zc = Zeroconf(interfaces=choice, ip_version=IPVersion.V4Only, use_asyncio=False)
    browser: ServiceBrowser | None = None
    try:
        info = ServiceInfo(
            SERVICE_TYPE,
            f"{node_id}.{SERVICE_TYPE}",
            port=port,
            properties=build_txt(node_id, fleet_id, port, protocol_version),
            server=f"{node_id}.local.",
            parsed_addresses=published,
        )
        # Browse first: registering probes and announces for a second or two, and peers
        # that announce meanwhile are found at once rather than after it (issue 14).
        browser = ServiceBrowser(zc, SERVICE_TYPE, handlers=[discovery._on_state_change])
        # The instance name is not trusted by anyone (the TXT id is), so a squatted name
        # is renamed rather than stopping the daemon.
        zc.register_service(info, allow_name_change=True)
    except BaseException:
        if browser is not None:
            browser.cancel()
        zc.close()
        raise
    return zc, browser, info


def _stop(zc: Zeroconf, browser: ServiceBrowser) -> None:
    try:
        browser.cancel()
    finally:
        try:
            zc.unregister_all_services()  # goodbye packets (TTL 0)
        finally:
            zc.close()


@asynccontextmanager
async def open_discovery(
    *,
    node_id: str,
    fleet_id: str,
    port: int,
    on_peer: PeerCallback,
    protocol_version: int,
    interfaces: Sequence[str] | None = None,
    address_poll_s: float = ADDRESS_POLL_S,
    on_peer_lost: LostCallback | None = None,
    is_member: MemberCheck | None = None,
) -> AsyncIterator[Discovery]:
    """Advertise this node and browse for fleet peers until the block exits.

    ``interfaces``: names (``eth0``) or IPv4 addresses to bind and publish; ``None`` means
    all interfaces (publishing the non-loopback IPv4 addresses). ``on_peer`` runs in the
    trio thread for every valid record of our fleet (again when a record changes) whose id
    ``is_member`` accepts (None: every id); ``on_peer_lost`` with the node id when its
    record says goodbye or expires (or names a non-member now). Every
    ``address_poll_s`` the published addresses are read again and re-announced on change.
    On exit goodbye packets are sent and zeroconf is closed.
    """
    build_txt(node_id, fleet_id, port, protocol_version)  # fail fast on our own bad values
    discovery = Discovery(
        node_id=node_id,
        fleet_id=fleet_id,
        on_peer=on_peer,
        trio_token=trio.lowlevel.current_trio_token(),
        on_peer_lost=on_peer_lost,
        is_member=is_member,
    )
    try:
        # Not abandoned on cancel: an abandoned start would leave sockets and threads
        # behind. zeroconf bounds registration itself (EventLoopBlocked after ~3 s).
        zc, browser, info = await trio.to_thread.run_sync(
            _start, node_id, fleet_id, port, protocol_version, interfaces, discovery
        )
    except (OSError, EventLoopBlocked, NonUniqueNameException) as e:
        raise DiscoveryError(f"zeroconf could not start: {e!r}") from e
    discovery._zc = zc
    discovery.advertised = tuple(info.parsed_addresses())
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(
                follow_addresses, zc, info, published=lambda: _published_now(interfaces),
                all_interfaces=not interfaces, on_change=discovery._readvertised,
                poll_s=address_poll_s))
            try:
                yield discovery
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(STOP_TIMEOUT_S) as scope:
            # The trio-typing stubs that py-libp2p pulls in predate abandon_on_cancel.
            await trio.to_thread.run_sync(  # type: ignore[call-arg]
                _stop, zc, browser, abandon_on_cancel=True
            )
        if scope.cancelled_caught:
            logger.warning("zeroconf did not stop within %.0f s; abandoned", STOP_TIMEOUT_S)
