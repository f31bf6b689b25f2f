"""The daemon's view of how each connected peer is reached: its path (LAN, direct, relayed via
a relay, hole-punched) and its round-trip time, for ``peerd peers`` and ``peerd status``.

Paths are read when a status is built, from the transport's live connections
(:meth:`~peerd.net.transport.Transport.connection_multiaddrs`) and classified by
:func:`peerd.node.paths.classify`; RTTs come from :class:`peerd.net.ping.Pinger`, which runs
beside gossip while the host is up. It must not dial nor decide anything about gossip.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from peerd.net.addrs import ADDRESS_POLL_S, local_networks
from peerd.net.holepunch import dcutr_upgraded
from peerd.net.ping import Pinger
from peerd.net.transport import Transport
from peerd.node.paths import Network, classify
from peerd.node.peers import PeerTable


@dataclass(frozen=True, slots=True)
class Link:
    """One connected peer's path and RTT (meets peerd.control.snapshot.PeerLink)."""

    path: str
    relay: str | None
    rtt_ms: float | None
    rtt_last_ms: float | None


class PeerLinks:
    def __init__(self, peers: PeerTable) -> None:
        self._peers = peers
        self.pinger: Pinger | None = None
        self._networks: tuple[Network, ...] = ()
        self._networks_at = -ADDRESS_POLL_S

    def start(self, transport: Transport, targets: Callable[[], Iterable[str]]) -> Pinger:
        self.pinger = Pinger(transport, targets)
        return self.pinger

    def networks(self) -> tuple[Network, ...]:
        """Our interfaces' subnets, read again at most once per ADDRESS_POLL_S: a status is
        built per control request and per metrics scrape, getifaddrs(3) need not be."""
        now = time.monotonic()
        if now - self._networks_at >= ADDRESS_POLL_S:
            self._networks, self._networks_at = local_networks(), now
        return self._networks

    def snapshot(self, transport: Transport, connected: Iterable[str]) -> dict[str, Link]:
        nets = self.networks()
        # Empty until a DCUtR service runs on the host (none does in the daemon yet).
        punched = dcutr_upgraded(transport.host)
        out: dict[str, Link] = {}
        for pid in connected:
            entry = self._peers.get(pid)
            path = classify(transport.connection_multiaddrs(pid), nets,
                            mdns=entry is not None and entry.source == "mdns",
                            hole_punched=pid in punched)
            if path is None:
                continue
            rtt = None if self.pinger is None else self.pinger.table.get(pid)
            out[pid] = Link(path=path.kind, relay=path.relay,
                            rtt_ms=None if rtt is None else rtt.smoothed_ms,
                            rtt_last_ms=None if rtt is None else rtt.last_ms)
        return out
