"""The host's own addresses: what a node bound to a wildcard can be reached at, and when that
changes.

A daemon listens on ``0.0.0.0`` by default; that address is no destination, so what it
advertises (mDNS A records, libp2p identify, ``peerd status``) must be the concrete addresses
of the host's interfaces, read here with ``ifaddr`` at the moment they are needed. Addresses
change under a running daemon (DHCP renewal, a laptop moving between networks, a link going
down and up): :func:`snapshot` captures what an advertisement depends on, so a poller can
compare two and re-announce when they differ.

It only reads the interface table (``getifaddrs`` and ``/sys/class/net``); it must not open
sockets or talk to zeroconf or libp2p (:mod:`peerd.net.discovery` and
:mod:`peerd.net.transport` do).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ifaddr

#: Seconds between two looks at the interface table: a moved laptop or a renewed lease is
#: advertised within this (plus an announcement), and a look costs one getifaddrs(3) call.
ADDRESS_POLL_S = 5.0
#: Interfaces whose link state counts (a host has a handful; a container farm a few hundred):
#: bounds the /sys reads of one look.
MAX_WATCHED_LINKS = 256
#: Link states (/sys/class/net/IF/operstate) in which nothing can be sent or received.
_DOWN_STATES = frozenset({"down", "lowerlayerdown", "notpresent"})
_SYS_NET = Path("/sys/class/net")


def host_ips(version: int = 4) -> tuple[str, ...]:
    """The host's unicast addresses of one IP version, sorted (IPv4 numerically).

    Loopback only when there is nothing else (a lone machine still reaches itself); IPv6
    link-local addresses are left out, since they are useless to a peer without a zone."""
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if ip.is_IPv4 != (version == 4):
                continue
            raw = ip.ip if isinstance(ip.ip, str) else ip.ip[0]
            try:
                found.add(ipaddress.ip_address(raw))
            except ValueError:
                continue
    usable = {a for a in found if not (a.is_link_local or a.is_multicast or a.is_unspecified)}
    lan = {a for a in usable if not a.is_loopback}
    return tuple(str(a) for a in sorted(lan or usable))


def local_ips() -> frozenset[str]:
    """Every address assigned to an interface of the host now, loopback and link-local
    included (IPv6 without a zone): what a socket may still be bound to."""
    found: set[str] = set()
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            raw = ip.ip if isinstance(ip.ip, str) else ip.ip[0]
            try:
                found.add(str(ipaddress.ip_address(raw.split("%")[0])))
            except ValueError:
                continue
    return frozenset(found)


def local_networks() -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """The subnets of the host's interfaces now (each address with its prefix length): a
    peer whose address lies in one is on one of our links (:mod:`peerd.node.paths`)."""
    found: set[ipaddress.IPv4Network | ipaddress.IPv6Network] = set()
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            raw = ip.ip if isinstance(ip.ip, str) else ip.ip[0]
            try:
                found.add(ipaddress.ip_network(f"{raw.split('%')[0]}/{ip.network_prefix}",
                                               strict=False))
            except ValueError:
                continue
    return tuple(sorted(found, key=lambda n: (n.version, str(n))))


def _split_tcp(maddr: str) -> tuple[str, str, str] | None:
    """``/ip4/H/tcp/P`` -> ("ip4", H, "/tcp/P"); None for anything else."""
    parts = maddr.split("/")
    if len(parts) < 5 or parts[0] or parts[1] not in ("ip4", "ip6"):
        return None
    return parts[1], parts[2], "/" + "/".join(parts[3:])


def concrete_addrs(bound: Sequence[str]) -> list[str]:
    """``bound`` multiaddrs with every wildcard host (``0.0.0.0``, ``::``) replaced by the
    host's current addresses of that family; concrete ones are kept as they are."""
    out: list[str] = []
    for maddr in bound:
        split = _split_tcp(maddr)
        if split is None or split[1] not in ("0.0.0.0", "::"):  # noqa: S104 -- the wildcard
            out.append(maddr)
            continue
        proto, _, rest = split
        out.extend(f"/{proto}/{ip}{rest}" for ip in host_ips(4 if proto == "ip4" else 6))
    return list(dict.fromkeys(out))  # one each, first place kept


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What an advertisement depends on: the addresses, and which links are up."""

    addresses: tuple[str, ...]
    links_up: frozenset[str]

    def calls_for_announcement(self, before: Snapshot) -> bool:
        """Addresses came or went (peers hold wrong records), or a link came (back) up
        (peers may have forgotten us meanwhile, and a newcomer there has not heard of us):
        RFC 6762 §8.3–8.4. A link going down alone is nothing to announce."""
        return self.addresses != before.addresses or bool(self.links_up - before.links_up)


def _links_up() -> frozenset[str]:
    up: set[str] = set()
    try:
        links = sorted(_SYS_NET.iterdir())[:MAX_WATCHED_LINKS]
    except OSError:  # no sysfs (not Linux, a restricted container): addresses only
        return frozenset()
    for link in links:
        try:
            state = (link / "operstate").read_text().strip()
        except OSError:
            continue
        if state not in _DOWN_STATES:
            up.add(link.name)
    return frozenset(up)


def snapshot(addresses: Sequence[str]) -> Snapshot:
    """``addresses`` (what the caller advertises now) with the links that are up: a link
    that went down and came back up changes nothing in the addresses, yet peers have
    forgotten us meanwhile, so it also calls for an announcement."""
    return Snapshot(tuple(sorted(addresses)), _links_up())
