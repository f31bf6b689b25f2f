"""Our own per-peer table: one :class:`~peerd.net.transport_config.PeerStats` per remote
peer (bytes, streams, budgets, errors), bounded by us.

Every authenticated identity that connects gets an entry, and identities are free to make,
so without a bound a stranger cycling keys would grow the table without end (the guide's
rule: every table kept per remote peer is bounded by us). Past ``max_peers`` the entries of
idle, disconnected peers go, oldest first; their bytes are kept in two totals so that the
byte counters the metrics export never go down. libp2p-free: the transport tells it who is
connected.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

from peerd.net.transport_config import PeerStats


class PeerCounters:
    """Per-peer counters, created on first use, at most ``max_peers`` kept when idle."""

    def __init__(self, new: Callable[[], PeerStats], max_peers: int) -> None:
        self._stats: defaultdict[str, PeerStats] = defaultdict(new)
        self._max = max_peers
        #: Bytes of peers whose counters were forgotten, so the totals never go down.
        self._forgotten_in = self._forgotten_out = 0

    def __getitem__(self, peer_id: str) -> PeerStats:
        """The peer's counters, a fresh entry if it has none."""
        return self._stats[peer_id]

    def snapshot(self) -> dict[str, PeerStats]:
        """A copy of every entry (the caller may keep it)."""
        return {p: replace(s) for p, s in self._stats.items()}

    def byte_totals(self) -> tuple[int, int]:
        """(bytes in, bytes out) with every peer since start, forgotten ones included."""
        return (self._forgotten_in + sum(s.bytes_in for s in self._stats.values()),
                self._forgotten_out + sum(s.bytes_out for s in self._stats.values()))

    def seen(self, peer_id: str, *, connected: bool,
             is_connected: Callable[[str], bool]) -> None:
        """A connection of ``peer_id`` opened or closed: stamp it, then keep to the bound."""
        # A late "disconnected" must not resurrect the entry of a peer already forgotten.
        stats = self._stats[peer_id] if connected else self._stats.get(peer_id)
        if stats is not None:
            stats.last_seen = time.time()
        if len(self._stats) > self._max:
            self._forget_idle(is_connected)

    def _forget_idle(self, is_connected: Callable[[str], bool]) -> None:
        idle = sorted(
            (s.last_seen, p)
            for p, s in self._stats.items()
            if s.streams_in == 0 and s.streams_out == 0 and not is_connected(p)
        )
        for _, p in idle[: len(self._stats) - self._max]:
            gone = self._stats.pop(p)
            self._forgotten_in += gone.bytes_in
            self._forgotten_out += gone.bytes_out
