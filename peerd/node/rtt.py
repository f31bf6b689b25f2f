"""Round-trip times per connected peer: the last sample and a smoothed value, and which peers
are due for a ping (pure bookkeeping; time passed in).

The samples come from libp2p's ping protocol (``/ipfs/ping/1.0.0``, :mod:`peerd.net.ping`),
which every py-libp2p host serves by default, so every member answers. The smoothed value is
TCP's SRTT (RFC 6298 §2): an exponentially weighted moving average with gain 1/8, so one
slow sample (a ping queued behind a 40 MB entry on the same Yamux connection) moves it an
eighth of the way and a lasting change shows within about a dozen samples.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: RFC 6298's α: the weight of a new sample in the smoothed RTT.
SRTT_GAIN = 1 / 8
#: Seconds between two pings of one peer: bounds the probe traffic a fleet of N connected
#: peers costs (N × 64 bytes per interval, plus a stream open) and how stale an RTT shown is.
PING_INTERVAL_S = 15.0
#: Pings running at once: bounds the streams and tasks one tick opens when many peers are due
#: together (all of them, right after start-up); the rest wait for the next tick.
MAX_PINGS_IN_FLIGHT = 4
#: Seconds a ping may take before it counts as failed (the sample is dropped, the peer is
#: pinged again one interval later): a path this slow has worse trouble than its RTT.
PING_TIMEOUT_S = 5.0


@dataclass(slots=True)
class Rtt:
    #: Milliseconds: the smoothed value and the last sample (None until one succeeded).
    smoothed_ms: float | None = None
    last_ms: float | None = None
    #: When the last ping started (success or not): the next is due an interval later.
    pinged_at: float | None = None
    #: Pings that failed in a row (timed out, refused, stream reset); reset by a sample.
    failures: int = 0
    in_flight: bool = False


class RttTable:
    """The connected peers' round-trip times. Bounded by the connected peers: a peer is
    forgotten when it is no longer connected (:meth:`keep_only`)."""

    def __init__(self, interval_s: float = PING_INTERVAL_S,
                 max_in_flight: int = MAX_PINGS_IN_FLIGHT) -> None:
        self.interval_s = interval_s
        self.max_in_flight = max_in_flight
        self._rtt: dict[str, Rtt] = {}

    def get(self, peer: str) -> Rtt | None:
        return self._rtt.get(peer)

    def keep_only(self, connected: Iterable[str]) -> None:
        """Forget every peer not in ``connected`` (a reconnected peer starts afresh: its new
        connection may take another path)."""
        keep = set(connected)
        for peer in [p for p in self._rtt if p not in keep]:
            if not self._rtt[peer].in_flight:
                del self._rtt[peer]

    def due(self, connected: Iterable[str], now: float) -> list[str]:
        """The peers to ping now, never pinged first, then the longest unpinged; at most as
        many as free in-flight slots. Each is marked in flight (end it with
        :meth:`record` or :meth:`failed`)."""
        free = self.max_in_flight - sum(1 for r in self._rtt.values() if r.in_flight)
        waiting = []
        for peer in connected:
            r = self._rtt.setdefault(peer, Rtt())
            if r.in_flight:
                continue
            if r.pinged_at is None or now - r.pinged_at >= self.interval_s:
                waiting.append((-1.0 if r.pinged_at is None else r.pinged_at, peer))
        chosen = [peer for _, peer in sorted(waiting)[:max(0, free)]]
        for peer in chosen:
            r = self._rtt[peer]
            r.in_flight, r.pinged_at = True, now
        return chosen

    def record(self, peer: str, rtt_ms: float) -> None:
        r = self._rtt.setdefault(peer, Rtt())
        r.in_flight, r.failures, r.last_ms = False, 0, rtt_ms
        r.smoothed_ms = rtt_ms if r.smoothed_ms is None else \
            r.smoothed_ms + SRTT_GAIN * (rtt_ms - r.smoothed_ms)

    def failed(self, peer: str) -> None:
        r = self._rtt.setdefault(peer, Rtt())
        r.in_flight = False
        r.failures += 1
