"""Closing connections whose path is gone, so that the next stream goes over a fresh dial
(mend 9 of :mod:`peerd.net.mends`).

py-libp2p keeps a connection open, and reuses it for every new stream, however long its
path has been gone: after a partition heals, a stream opened on a connection that carried
data during the cut waits for TCP's next retransmission (the timeout doubles at each try),
and after the host's address changes, the connections bound to the old address are dead
for good. This module decides which connections are dead and closes them: one that TCP
reports stalled (:func:`peerd.net.mends.stalled`), or one bound to an address the host no
longer has; before a stream is opened to a peer, and every ``CONNECTION_SWEEP_S``.

It sees connections only as opaque handles, listed and closed by
:class:`peerd.net.transport.Transport`, and their sockets through
:func:`peerd.net.mends.socket_of`; it must not open streams, dial, or decide whom to dial.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable

import trio

from peerd.net.addrs import local_ips
from peerd.net.mends import abort, local_ip, socket_of, stalled
from peerd.net.transport_config import CONNECTION_SWEEP_S

logger = logging.getLogger(__name__)

#: (peer id, connection handle) for the connections of one peer, or of all with None.
ListConnections = Callable[[str | None], list[tuple[str, Hashable]]]
CloseConnection = Callable[[Hashable], Awaitable[None]]


class Liveness:
    """The judge and closer of dead connections of one transport."""

    def __init__(self, connections: ListConnections, close: CloseConnection) -> None:
        self._connections = connections
        self._close = close
        #: Connections closed as dead, by why: "stalled", "address gone", "stream failed".
        self.closed: dict[str, int] = {}

    @staticmethod
    def dead(conn: Hashable, ours: frozenset[str] | None) -> str | None:
        """Why ``conn`` is dead ("stalled", "address gone"), or None. ``ours``: the host's
        addresses now (None: not checked)."""
        try:
            return Liveness._dead(conn, ours)
        except Exception:  # a judgement must never take a stream or the host down
            logger.exception("judging a connection failed")
            return None

    @staticmethod
    def _dead(conn: Hashable, ours: frozenset[str] | None) -> str | None:
        sock = socket_of(conn)
        if sock is None:
            return None
        if stalled(sock):
            return "stalled"
        if ours:  # an empty read of the interface table proves nothing
            ip = local_ip(sock)
            if ip is not None and ip not in ours:
                return "address gone"
        return None

    async def close(self, peer_id: str, conn: Hashable, why: str) -> None:
        """Abort ``conn``'s socket (nothing left to wait for) and close the connection."""
        sock = socket_of(conn)
        if sock is not None:
            abort(sock)
        self.closed[why] = self.closed.get(why, 0) + 1
        logger.info("closing a connection to %s: %s", peer_id[-8:], why)
        await self._close(conn)

    async def drop_dead(self, peer_id: str | None = None,
                        ours: frozenset[str] | None = None) -> int:
        """Close the dead connections of ``peer_id`` (of every peer with None); how many."""
        n = 0
        for peer, conn in self._connections(peer_id):
            why = self.dead(conn, ours)
            if why is not None:
                await self.close(peer, conn, why)
                n += 1
        return n

    async def drop_all(self, peer_id: str, why: str) -> None:
        """Close every connection of ``peer_id`` (a stream to it could not be opened)."""
        for peer, conn in self._connections(peer_id):
            await self.close(peer, conn, why)

    async def sweep(self, interval_s: float = CONNECTION_SWEEP_S) -> None:
        """Every ``interval_s``: close stalled connections and those bound to an address
        the host lost. Runs until cancelled."""
        while True:
            await trio.sleep(interval_s)
            try:
                if not self._connections(None):
                    continue
                ours = await trio.to_thread.run_sync(local_ips)
                await self.drop_dead(None, ours)
            except Exception:  # the sweep runs in the host's nursery: it must not end it
                logger.exception("sweeping connections failed; trying again")
