"""Which peers DCUtR upgraded to a direct connection, read from py-libp2p 0.8.1's
``DCUtRProtocol`` when one runs on the host (docs/transport.md, "DCUtR").

The daemon runs DCUtR with ``[network] hole_punch`` (:class:`peerd.net.dcutr.HolePunch`);
the service registers itself on the host (``host._dcutr_protocol``, py-libp2p's own hook
for its disconnect notifications), and the peers it dialled directly (a hole punch or its
step-0 plain dial, each made while the peer was reached only through a relay) are what
:func:`peerd.node.paths.classify` then reports as ``hole-punched``. peerd's service keeps
its own record (:meth:`~peerd.net.dcutr.HolePunch.punched_peers`: the peer counts while a
connection the punch opened is open); a plain ``DCUtRProtocol`` has only its
``_direct_connections``, from which py-libp2p drops a peer when *any* of its connections
closes (the relayed leg too). It must not start, dial or change anything.
"""

from __future__ import annotations

from libp2p.abc import IHost


def dcutr_upgraded(host: IHost) -> frozenset[str]:
    """Peer ids DCUtR opened a direct connection to (empty when no DCUtR service runs)."""
    service = getattr(host, "_dcutr_protocol", None)
    punched = getattr(service, "punched_peers", None)
    if callable(punched):
        try:
            return frozenset(punched())
        except Exception:  # noqa: BLE001 - a table read mid-change: no punches this time
            return frozenset()
    peers = getattr(service, "_direct_connections", None)
    if not peers:
        return frozenset()
    try:
        return frozenset(str(p) for p in list(peers))
    except Exception:  # noqa: BLE001 - a library's private set changing shape: no punches
        return frozenset()
