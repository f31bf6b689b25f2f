"""Relays learned by address exchange (issue 27, item 2): which members' relay services a
member reserves a slot on besides its configured ``[network] relays``.

A member running ``[network] relay_service`` says so in its signed address record
(``relay``, ``peerd.protocol.peerrecord``); a record is its subject's own word, so no peer
can name another as a relay. From the address book, :func:`pick_learned` takes at most
:data:`MAX_LEARNED_RELAYS` of them:

- members only (the manifest held now), never ourselves, never a configured relay (the
  configured ones come first and are kept whatever the book says);
- records not expired, with a direct address another site can dial: not a circuit and not
  in a private range (:func:`_site_local`: a relay on a site's own network serves only that
  site, which its members reach without one);
- the relays learned before stay while they qualify (a reservation is a kept connection:
  swapping relays each time a fresher record comes would drop and remake it), and free
  places go to the records that expire last (the freshest), ties by node id, so the choice
  is the same on every run over the same book.

A learned relay goes as soon as its record expires, is pruned (no longer a member) or stops
saying ``relay``. Pure: the book, the clock and the membership are passed in.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Sequence

from peerd.protocol.peerrecord import PeerRecord, is_circuit

#: Learned relays used beside the configured ones. Each holds a reservation (a connection
#: kept open, refreshed) and is asked for AutoNAT; two give a NAT'd member a second way in
#: when one relay is down, as two configured relays do, without a reservation on every
#: relay member of a large fleet.
MAX_LEARNED_RELAYS = 2

#: Ranges another site cannot dial (RFC 1918, shared address space, ULA, loopback,
#: link-local): a relay there is a relay for its own site only.
_SITE_LOCAL = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8",
    "169.254.0.0/16", "fc00::/7", "fe80::/10", "::1/128"))


def _site_local(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:  # a DNS name: dialable as far as we can tell
        return False
    return any(ip in net for net in _SITE_LOCAL if net.version == ip.version)


def relay_addr(record: PeerRecord) -> str | None:
    """``<direct address>/p2p/<node id>`` of a relay member's record: its first address
    that is neither a circuit nor site-local; None when it has none (or claims no relay)."""
    if not record.relay:
        return None
    for addr in record.addrs:
        if not is_circuit(addr) and not _site_local(addr.split("/")[2]):
            return f"{addr}/p2p/{record.node_id}"
    return None


def pick_learned(records: Iterable[PeerRecord], *, self_id: str, now: float,
                 is_member: Callable[[str], bool], configured: Sequence[str],
                 current: Sequence[str] = (),
                 limit: int = MAX_LEARNED_RELAYS) -> tuple[str, ...]:
    """The learned relays (``…/tcp/PORT/p2p/ID``) to use now, those of ``current`` that
    still qualify first (module docstring)."""
    configured_ids = {a.rpartition("/p2p/")[2] for a in configured}
    usable: dict[str, tuple[str, PeerRecord]] = {}
    for record in records:
        if record.node_id == self_id or record.node_id in configured_ids or \
                record.expires <= now or not is_member(record.node_id):
            continue
        addr = relay_addr(record)
        if addr is not None:
            usable[record.node_id] = (addr, record)
    kept: list[str] = []
    for addr in current:
        node_id = addr.rpartition("/p2p/")[2]
        if node_id in usable and len(kept) < limit:
            kept.append(usable.pop(node_id)[0])  # its address as its record says now
    fresh = sorted(usable.values(), key=lambda v: (-v[1].expires, v[1].node_id))
    return tuple(kept + [addr for addr, _ in fresh[:max(0, limit - len(kept))]])
