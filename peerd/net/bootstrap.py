"""``[network] bootstrap``: the members a node dials to join, their DNS names resolved.

Each entry is ``/ip4|ip6|dns|dns4|dns6/HOST/tcp/PORT/p2p/ID`` (checked at start-up by
``peerd.daemon.config_checks.check_bootstrap``: a malformed one stops the daemon). An IP
entry goes to the peer table as it is; a DNS name is resolved here (the system resolver,
``getaddrinfo`` in a worker thread: /etc/hosts and search domains work as for any program),
and a name that does not resolve is logged and tried again after a backoff
(``peerd.node.peers.backoff_s``). The table dials them like static peers, with its own
backoff for unreachable ones. While no peer is in reach (no session completed for
:data:`OUT_OF_REACH_S`) the names are resolved again and the bootstrap peers dialled at the
next sweep, backoff or not (once each time it is cut off; then the table's backoff runs
again): that is how a node cut off finds its way back.

It resolves names and nothing else: whom to dial is the peer table's, the dialling the
daemon's.
"""

from __future__ import annotations

import logging
import random
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from peerd.node.peers import backoff_s

log = logging.getLogger(__name__)

#: How often the loop looks whether the node is cut off (and DNS retries are due).
CHECK_INTERVAL_S = 10.0
#: No session with anyone for this long: the node is out of reach of the fleet.
OUT_OF_REACH_S = 60.0
#: One name's resolution; a resolver that hangs must not hold the loop.
RESOLVE_TIMEOUT_S = 10.0
_FAMILY = {"dns4": socket.AF_INET, "dns6": socket.AF_INET6, "dns": socket.AF_UNSPEC}


@dataclass(slots=True)
class Entry:
    """One bootstrap multiaddr and how resolving it went."""

    text: str
    proto: str
    host: str
    port: int
    peer_id: str
    failures: int = 0
    retry_at: float = 0.0  # trio time; 0: due now


def parse(text: str) -> Entry:
    """An entry already checked by the config (``/PROTO/HOST/tcp/PORT/p2p/ID``)."""
    head, _, peer_id = text.rpartition("/p2p/")
    _, proto, host, _, port = head.split("/")
    return Entry(text, proto, host, int(port), peer_id)


async def resolve(entry: Entry) -> tuple[str, ...]:
    """TCP multiaddrs for the entry: itself for an IP literal, else every address the name
    resolves to (OSError if it does not; trio.TooSlowError after RESOLVE_TIMEOUT_S)."""
    if entry.proto in ("ip4", "ip6"):
        return (f"/{entry.proto}/{entry.host}/tcp/{entry.port}",)
    with trio.fail_after(RESOLVE_TIMEOUT_S):
        infos = await trio.socket.getaddrinfo(entry.host, entry.port, _FAMILY[entry.proto],
                                              socket.SOCK_STREAM)
    addrs = []
    for family, _, _, _, sockaddr in infos:
        proto = "ip6" if family == socket.AF_INET6 else "ip4"
        addrs.append(f"/{proto}/{sockaddr[0]}/tcp/{entry.port}")
    if not addrs:
        raise OSError(f"{entry.host} has no address")
    return tuple(dict.fromkeys(addrs))


async def resolve_addr(addr: str) -> tuple[str, ...]:
    """:func:`resolve` for a checked ``/PROTO/HOST/tcp/PORT`` (a relay's address, resolved
    when it is dialled: ``peerd.net.relayclient``, ``peerd.net.reachability``)."""
    return await resolve(parse(f"{addr}/p2p/"))


async def keep_bootstrapped(
    texts: Sequence[str], *, add: Callable[[str, tuple[str, ...]], None],
    in_reach: Callable[[], bool], retry: Callable[[], None], rng: random.Random,
) -> None:
    """Resolve every entry now and hand it to ``add(peer_id, addrs)``; retry names that did
    not resolve after a backoff; when ``in_reach()`` turns false, resolve them all again and
    call ``retry()`` (the table dials the bootstrap peers at once)."""
    entries = [parse(t) for t in texts]
    was_in_reach = False  # at start the table dials them anyway
    while True:
        now = trio.current_time()
        for entry in entries:
            if now < entry.retry_at:
                continue
            try:
                addrs = await resolve(entry)
            except (OSError, trio.TooSlowError) as exc:
                entry.failures += 1
                delay = backoff_s(entry.failures, rng)
                entry.retry_at = trio.current_time() + delay
                log.warning("bootstrap %s: cannot resolve %s (%s); retrying in %.0f s",
                            entry.text, entry.host, exc or "timed out", delay)
                continue
            entry.failures, entry.retry_at = 0, float("inf")  # until the node is cut off
            add(entry.peer_id, addrs)
        await trio.sleep(CHECK_INTERVAL_S)
        reached = in_reach()
        if was_in_reach and not reached:  # once when cut off: the table's backoff resumes
            retry()
            for entry in entries:
                if entry.failures == 0:
                    entry.retry_at = 0.0  # re-resolve: the name may point elsewhere now
        was_in_reach = reached
