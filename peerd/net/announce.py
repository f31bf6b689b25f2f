"""Keeping our mDNS advertisement true while the host's addresses change under it.

A running node's addresses change (a DHCP renewal, a laptop moving between networks) and its
links go down and up. Every ``ADDRESS_POLL_S`` the addresses to advertise are read again
(:mod:`peerd.net.addrs`); when they came or went, the vanished A records get goodbye
packets (TTL 0, RFC 6762 §10.1), so peers drop them at once instead of after their TTL, the
service is announced with the new ones (§8.4) and zeroconf's sockets are reconciled, in an
order that never announces a vanished record again (:func:`readvertise`); a link
coming back up is announced again too (§8.3). Peers then dial the node where it is now,
without it restarting.

It only re-advertises the service :mod:`peerd.net.discovery` registered; it must not
browse, parse records from the network or decide whom to dial.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence

import trio
from zeroconf import (  # type: ignore[attr-defined]  # DNSOutgoing: exported, not in __all__
    DNSOutgoing,
    EventLoopBlocked,
    ServiceInfo,
    Zeroconf,
)

from peerd.net.addrs import Snapshot, snapshot

logger = logging.getLogger(__name__)

#: DNS header flags of an announcement: a response (QR), authoritative (AA) (RFC 6762 §18).
_FLAGS_ANNOUNCE = 0x8000 | 0x0400
_MDNS_GROUP, _MDNS_PORT = "224.0.0.251", 5353


def readvertise(zc: Zeroconf, info: ServiceInfo, addresses: Sequence[str],
                bound: Sequence[str] | None) -> ServiceInfo:
    """Advertise ``info``'s service at ``addresses`` instead (blocking: a worker thread).

    Goodbyes for the A records that vanished come first, then the registration is replaced
    by the new records, and only then are zeroconf's sockets reconciled (one per interface
    address, on ``bound`` addresses or None for all interfaces): the rescan re-announces
    what is registered whenever it adds a socket, and while the old records were still
    registered that was the deleted address, cache-flush with a TTL of 120 s, multicast
    three times just before its goodbye (issue 27). When the only address changed,
    zeroconf has no socket that can send the goodbyes yet (the old one's source address is
    gone, the new one is made by the rescan), so they also leave from the new addresses on
    sockets of our own (:func:`_send_from`), before the new records are announced."""
    gone = sorted(set(info.parsed_addresses()) - set(addresses))
    if gone:
        goodbye = _goodbye(info, gone)
        zc.send(goodbye)  # on zeroconf's sockets that still work (other interfaces)
        _send_from(addresses, goodbye.packets())
    fresh = ServiceInfo(info.type, info.name, port=info.port, properties=info.properties,
                        server=info.server, parsed_addresses=list(addresses))
    zc.update_service(fresh)  # registered (and announced where a socket works)
    zc.update_interfaces(None if bound is None else list(bound))
    return fresh


def _goodbye(info: ServiceInfo, gone: Sequence[str]) -> DNSOutgoing:
    """TTL 0 for ``info``'s A records of the ``gone`` addresses (RFC 6762 §10.1): peers
    drop them at once."""
    stale = ServiceInfo(info.type, info.name, port=info.port, server=info.server,
                        parsed_addresses=list(gone))
    out = DNSOutgoing(_FLAGS_ANNOUNCE)
    for record in stale.dns_addresses(override_ttl=0):
        out.add_answer_at_time(record, 0)
    return out


def _send_from(addresses: Sequence[str], packets: Sequence[bytes]) -> None:
    """Multicast ``packets`` once from each of ``addresses`` (IPv4), from port 5353 as
    responses must be (RFC 6762 §11), beside zeroconf's own sockets (SO_REUSEADDR and
    SO_REUSEPORT, as zeroconf sets them). zeroconf has no public call that sends from an
    address it has no socket for yet. Best effort: a failure is logged."""
    for address in addresses:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 255)
                s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF,
                             socket.inet_aton(address))
                s.bind((address, _MDNS_PORT))
                for packet in packets:
                    s.sendto(packet, (_MDNS_GROUP, _MDNS_PORT))
        except OSError as e:
            logger.debug("mDNS goodbye from %s failed: %r", address, e)


def _loopback_only(addresses: Sequence[str]) -> bool:
    return all(a.startswith("127.") for a in addresses)


async def follow_addresses(zc: Zeroconf, info: ServiceInfo, *,
                           published: Callable[[], list[str]], all_interfaces: bool,
                           on_change: Callable[[tuple[str, ...]], None],
                           poll_s: float) -> None:
    """Re-advertise ``info`` whenever ``published()`` (the addresses to advertise, [] when
    there are none) changes or a link comes up; ``on_change`` is told what is advertised
    after each announcement. Runs until cancelled."""
    seen: Snapshot = snapshot(info.parsed_addresses())
    while True:
        await trio.sleep(poll_s)
        addresses = await trio.to_thread.run_sync(published)
        now = await trio.to_thread.run_sync(snapshot, addresses)
        if not now.calls_for_announcement(seen):
            seen = now  # a link went down: nothing to tell anyone until it is back
            continue
        if not addresses or (_loopback_only(addresses)
                             and not _loopback_only(info.parsed_addresses())):
            # Nothing a peer could use (lease lost; loopback would lead a LAN peer to
            # itself): keep the old records, which are no worse, and announce afresh as
            # soon as an address is back.
            logger.warning("no LAN address to advertise over mDNS; waiting for one")
            seen = now
            continue
        bound = None if all_interfaces else addresses
        try:
            info = await trio.to_thread.run_sync(readvertise, zc, info, addresses, bound)
        except (OSError, RuntimeError, EventLoopBlocked) as e:
            # Retried at the next look: seen is left as it was.
            logger.warning("re-announcing over mDNS failed: %r", e)
            continue
        why = "addresses changed" if now.addresses != seen.addresses else "link up"
        seen = now
        on_change(tuple(addresses))
        logger.info("%s: advertising %s over mDNS", why, ", ".join(addresses))
