"""A connected peer's path, read from its live connections' remote multiaddrs (pure, no sockets).

``peerd peers`` tells an operator how each peer is reached, because the answer decides what a
slow or lost link means (issue 27 item 3):

* ``lan``: a direct connection to an address on one of our own links: inside one of our
  interfaces' subnets, link-local (169.254/16, fe80::/10) or loopback (127/8, ::1: the peer
  runs on this host, which is as local as a link gets), or to a peer mDNS found (mDNS only
  reaches our own links, so it vouches for locality even when the subnet test cannot: a
  peer numbered outside our prefix on the same bridge);
* ``direct``: a direct connection to any other address (a static peer at a site's public
  address, a bootstrap node across the internet);
* ``relayed``: every open connection runs through a Circuit Relay v2 hop (the address holds
  ``/p2p-circuit``); the relay is the ``/p2p/ID`` just before it;
* ``hole-punched``: a direct connection that DCUtR opened to replace a relayed one. The
  kind is defined here; it is reported only when the caller says DCUtR upgraded the peer.

When a peer holds several connections the direct one wins, as py-libp2p's swarm picks it for
new streams (``Swarm._best_connection``: direct before relayed), so the path shown is the one
gossip's streams take.
"""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

PathKind = Literal["lan", "direct", "relayed", "hole-punched"]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

CIRCUIT = "p2p-circuit"


@dataclass(frozen=True, slots=True)
class PeerPath:
    kind: PathKind
    #: The relay's peer id on a relayed path (None: another kind, or the relay is unknown).
    relay: str | None = None


def _parts(maddr: str) -> list[str]:
    return [p for p in maddr.split("/") if p]


def relay_of(maddr: str) -> str | None:
    """The relay's peer id of a ``…/p2p/RELAY/p2p-circuit/…`` address (None if it names none)."""
    parts = _parts(maddr)
    if CIRCUIT not in parts:
        return None
    i = parts.index(CIRCUIT)
    return parts[i - 1] if i >= 2 and parts[i - 2] == "p2p" else None


def is_relayed(maddr: str) -> bool:
    return CIRCUIT in _parts(maddr)


def ip_of(maddr: str) -> IPAddress | None:
    """The IP address of an ``/ip4/…`` or ``/ip6/…`` multiaddr (None for anything else; an
    IPv6 zone, ``/ip6zone/…`` or ``%eth0``, is dropped; an IPv4-mapped IPv6 address is read
    as the IPv4 address it maps)."""
    parts = _parts(maddr)
    for proto, value in itertools.pairwise(parts):
        if proto not in ("ip4", "ip6"):
            continue
        try:
            ip = ipaddress.ip_address(value.split("%")[0])
        except ValueError:
            return None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        return ip
    return None


def is_local(ip: IPAddress, networks: Iterable[Network]) -> bool:
    """On one of our links: loopback, link-local, or inside one of ``networks`` (our
    interfaces' subnets)."""
    if ip.is_loopback or ip.is_link_local:
        return True
    return any(ip.version == net.version and ip in net for net in networks)


def classify(addrs: Sequence[str], networks: Iterable[Network], *, mdns: bool = False,
             hole_punched: bool = False) -> PeerPath | None:
    """The path of a peer whose open connections have the remote multiaddrs ``addrs``
    (None: no connection). ``mdns``: mDNS found the peer; ``hole_punched``: DCUtR replaced
    its relayed connection by a direct one."""
    if not addrs:
        return None
    direct = [a for a in addrs if not is_relayed(a)]
    if not direct:
        return PeerPath("relayed", relay_of(addrs[0]))
    if hole_punched:
        return PeerPath("hole-punched")
    nets = list(networks)
    for a in direct:
        ip = ip_of(a)
        if mdns or (ip is not None and is_local(ip, nets)):
            return PeerPath("lan")
    return PeerPath("direct")
