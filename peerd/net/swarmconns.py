"""The swarm's connection table, read and pruned: which connections a peer has, where they
go, and closing one so that it also leaves the table.

py-libp2p's swarm keeps ``connections: {peer ID: [connection, ...]}``; a closed connection
may stay listed (``is_closed``) and a close that hangs on a dead path leaves it listed for
good, after which the swarm counts the peer as connected and never dials it again (mend 9 of
:mod:`peerd.net.mends`). This module is the one place that reads and edits that table for
:class:`peerd.net.transport.Transport`, :mod:`peerd.net.admission` (mend 8) and
:mod:`peerd.net.liveness` (mend 9). It must not dial, open streams or decide which
connection to close.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import cast

import trio
from libp2p.abc import IMuxedConn, INetwork
from libp2p.peer.id import ID

from peerd.net.framing import TransportError
from peerd.net.transport_config import CLOSE_REFUSED_TIMEOUT_S

logger = logging.getLogger(__name__)


def parse_peer_id(peer_id: str) -> ID:
    """The libp2p ID of a peer-id string; :class:`TransportError` if it is malformed."""
    try:
        return ID.from_base58(peer_id)
    except Exception as e:
        raise TransportError(f"malformed peer id {peer_id!r}") from e


class SwarmConnections:
    """A view of one swarm's connection table."""

    def __init__(self, swarm: INetwork) -> None:
        self._swarm = swarm

    def muxed(self, peer_id: str | None) -> list[tuple[str, Hashable]]:
        """(peer id, muxed connection) of the open connections, of one peer or all."""
        conns = self._swarm.connections
        peers = list(conns) if peer_id is None else [parse_peer_id(peer_id)]
        return [(str(p), c.muxed_conn) for p in peers for c in list(conns.get(p, []))
                if not getattr(c, "is_closed", False)]

    def count(self, peer_id: str) -> int:
        """Open connections with ``peer_id``."""
        conns = self._swarm.connections.get(parse_peer_id(peer_id), [])
        return sum(1 for c in conns if not getattr(c, "is_closed", False))

    def remote_address(self, peer_id: str) -> str | None:
        """``IP:PORT`` of an open connection with ``peer_id`` (for the logs), None if none."""
        try:
            for conn in self._swarm.connections.get(parse_peer_id(peer_id), []):
                # Yamux has it (py-libp2p 0.8.1); the interface does not declare it.
                remote = getattr(conn.muxed_conn, "get_remote_address", lambda: None)()
                if remote is not None:
                    return f"{remote[0]}:{remote[1]}"
        except (TransportError, AttributeError, OSError):  # a torn connection: no address
            return None
        return None

    def remote_multiaddrs(self, peer_id: str) -> list[str]:
        """The remote multiaddr of each open connection with ``peer_id``: ``/ip4|ip6/…/tcp/…``
        of a direct one, ``/p2p/RELAY/p2p-circuit/p2p/PEER`` of a relayed one (what
        :func:`peerd.node.paths.classify` reads).

        py-libp2p 0.8.1 labels a relayed connection that *we* accepted (the hop's STOP
        stream) with our own id as the relay's; the relay is then read from the stream the
        connection runs over, the relay's own connection. A relayed connection's muxer
        reports the relay's TCP address as its remote address, so the circuit address is
        read first."""
        out: list[str] = []
        try:
            conns = list(self._swarm.connections.get(parse_peer_id(peer_id), []))
        except TransportError:
            return out
        own = str(self._swarm.get_peer_id())
        for conn in conns:
            if getattr(conn, "is_closed", False):
                continue
            try:
                addrs = [str(a) for a in conn.get_transport_addresses()]
            except Exception:  # noqa: BLE001 - a torn connection: read what the muxer says
                addrs = []
            circuit = next((a for a in addrs if "/p2p-circuit" in a), None)
            if circuit is not None:
                out.append(_relay_corrected(circuit, own, conn))
                continue
            remote = getattr(conn.muxed_conn, "get_remote_address", lambda: None)()
            if remote is not None:
                host, port = remote[0], remote[1]
                out.append(f"/ip6/{host}/tcp/{port}" if ":" in str(host)
                           else f"/ip4/{host}/tcp/{port}")
            elif addrs:
                out.append(addrs[0])
        return out

    async def close(self, conn: Hashable) -> None:
        """Close one connection (not the peer's others); its limiter slots go with it. It
        leaves the swarm's table even when closing it runs out of time (a dead path, mend
        9): listed, the peer would count as connected and never be dialled again."""
        swarm = self._swarm
        muxed = cast(IMuxedConn, conn)  # what the transport hands Admission and Liveness
        listed = [c for c in swarm.connections.get(muxed.peer_id, []) if c.muxed_conn is muxed]
        with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_REFUSED_TIMEOUT_S):
            try:
                await (listed[0].close() if listed else muxed.close())
            except Exception as e:  # noqa: BLE001 - a dead connection is no error here
                logger.debug("closing a connection failed: %r", e)
        for swarm_conn in listed:
            if swarm_conn in swarm.connections.get(muxed.peer_id, []):
                try:
                    swarm.remove_conn(swarm_conn)  # type: ignore[attr-defined]
                except Exception as e:  # noqa: BLE001 - bookkeeping of a dead connection
                    logger.debug("forgetting a closed connection failed: %r", e)


def _relay_corrected(circuit: str, own: str, conn: object) -> str:
    """``circuit`` with the relay's real id where py-libp2p put ours (see remote_multiaddrs)."""
    head, _, tail = circuit.partition("/p2p-circuit")
    if head != f"/p2p/{own}" and not head.endswith(f"/p2p/{own}"):
        return circuit
    # SwarmConn → Yamux → SecureSession → Noise reader → packet reader → RawConnection,
    # whose stream is the relay's STOP stream on our connection to the relay.
    node: object = getattr(conn, "muxed_conn", None)
    for attr in ("secured_conn", "conn", "read_writer", "read_write_closer", "stream",
                 "muxed_conn", "peer_id"):
        node = getattr(node, attr, None)
        if node is None:
            return "/p2p-circuit" + tail  # relayed, through a relay we cannot name
    return f"/p2p/{node}/p2p-circuit{tail}"
