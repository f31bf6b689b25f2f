"""DCUtR hole punching on the daemon's host (issue 27 item 3): ``[network] hole_punch``.

Two members behind NATs meet through a relay (:mod:`peerd.net.relayclient`); DCUtR then
trades their public addresses over the relayed connection and both dial at once from their
listen ports (a TCP simultaneous open), which two endpoint-independent NATs that drop
unsolicited SYNs let through (docs/transport.md, "DCUtR"). The swarm opens new streams on
a direct connection before a relayed one (``Swarm._best_connection``), so the sessions that
follow the punch run over it, and py-libp2p closes the relayed leg 60 s later.

:class:`HolePunch` is py-libp2p 0.8.1's ``DCUtRProtocol`` with what it lacks (mend 16 in
docs/transport.md's defects table), each at the library's own decision point:

- **admission**: the library serves a DCUtR stream from any connected peer and dials
  whatever addresses it sends, and its auto-drive loop punches towards every relayed peer.
  Here a stream from a peer the transport does not admit (not an active member) is reset
  before a byte is read, counted in :attr:`HolePunch.refused`, and we initiate only
  towards admitted peers;
- **what a CONNECT makes us dial**: the library decodes every address of a 4 KiB message
  (a hundred or more) and dials all of them, three rounds; here at most
  :data:`MAX_PUNCH_ADDRS` ``/ip4|ip6/…/tcp/…`` addresses are taken;
- **sessions at once**: the library runs any number of inbound sessions of one peer at
  once (each dialling); here one per peer and :data:`MAX_INBOUND_SESSIONS` in all;
- **per-peer tables**: attempts, locks, the in-progress and direct sets grow per peer and
  are emptied only by a disconnect notification; :meth:`HolePunch.sweep` (every
  :data:`SWEEP_S`) drops the entries of peers no longer connected, and no new peer enters
  once :data:`MAX_PUNCH_PEERS` are tracked;
- **which peers were punched**: the library forgets a punched peer when *any* of its
  connections closes, the relayed leg it closes itself 60 s after the punch included, so
  the path would read ``direct`` a minute later. Here the direct connections a punch (or
  DCUtR's step-0 dial) opened are recorded, and the peer counts as punched while one of
  them is open (:meth:`HolePunch.punched_peers`, read by :mod:`peerd.net.holepunch`).

It must not decide who is admitted (``admitted`` is the transport's verdict) nor dial
anything itself beyond what DCUtR does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio
from libp2p.abc import IHost, INetConn, INetStream
from libp2p.connection_types import ConnectionType
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.tools.anyio_service.context import background_trio_service
from multiaddr import Multiaddr

logger = logging.getLogger(__name__)

#: Addresses taken from one CONNECT message: a member behind one NAT has one or two public
#: addresses (IPv4, IPv6), each with a port or two; every one is dialled three rounds.
MAX_PUNCH_ADDRS = 8
#: DCUtR sessions peers opened with us that run at once (each dials the addresses it got).
MAX_INBOUND_SESSIONS = 4
#: Peers DCUtR tracks at once (attempts, locks, punched connections): relayed peers we hold
#: a connection with, themselves bounded by ``[network] max_connections`` and the inbound
#: cap; beyond it a new peer is not punched until the sweep frees a place.
MAX_PUNCH_PEERS = 256
#: Seconds between sweeps of the per-peer tables.
SWEEP_S = 10.0
#: Deadlines of DCUtR's own reads, writes and dials (the library's defaults: 30 s each;
#: a relayed round trip takes well under a second, a hole-punch dial either meets the
#: other side's within a second or two or never).
READ_TIMEOUT_S, WRITE_TIMEOUT_S, DIAL_TIMEOUT_S = 10, 10, 5


def _is_direct(conn: INetConn) -> bool:
    try:
        return bool(conn.get_connection_type() == ConnectionType.DIRECT)
    except Exception:  # noqa: BLE001 - a torn connection is no path
        return False


class HolePunch(DCUtRProtocol):
    """py-libp2p's DCUtR service, admission-gated and bounded (module docstring). Run it
    with ``background_trio_service``; it registers itself on the host as
    ``host._dcutr_protocol`` (the library's hook for disconnect notifications)."""

    def __init__(self, host: IHost, admitted: Callable[[str], bool], *,
                 max_peers: int = MAX_PUNCH_PEERS) -> None:
        super().__init__(host, read_timeout=READ_TIMEOUT_S, write_timeout=WRITE_TIMEOUT_S,
                         dial_timeout=DIAL_TIMEOUT_S)
        self._admitted = admitted
        self._max_peers = max_peers
        #: Direct connections a punch opened, per peer (while one is open: punched).
        self._punched: dict[ID, list[INetConn]] = {}
        #: Peers whose inbound session runs now.
        self._inbound: set[ID] = set()
        self.refused = 0  #: DCUtR streams of peers not admitted, reset unread
        self.busy = 0  #: DCUtR streams reset as one too many at once
        self.punches = 0  #: direct connections DCUtR opened (punch or step 0)

    # ------------------------------------------------------------------ what others read
    def punched_peers(self) -> frozenset[str]:
        """Peers with a direct connection open that DCUtR opened."""
        conns = self.host.get_network().connections
        return frozenset(str(peer) for peer, mine in list(self._punched.items())
                         if any(c in conns.get(peer, []) for c in mine))

    def counts(self) -> dict[str, int]:
        """For ``peerd status --json``'s ``libp2p`` block (``dcutr_*`` keys)."""
        return {"dcutr_refused": self.refused, "dcutr_busy": self.busy,
                "dcutr_punches": self.punches, "dcutr_punched": len(self.punched_peers()),
                "dcutr_tracked": self.tracked()}

    def tracked(self) -> int:
        """Peers in DCUtR's largest per-peer table now (for the bound's test)."""
        return max(len(t) for t in self._tables())

    def _tables(self) -> list[dict[ID, Any] | set[ID]]:
        return [self._hole_punch_attempts, self._direct_connections, self._in_progress,
                self._initiate_locks, self._punched, self._inbound]

    def _has_room(self, peer: ID) -> bool:
        return any(peer in t for t in self._tables()) or self.tracked() < self._max_peers

    # ------------------------------------------------------------------ the gates
    async def _handle_dcutr_stream(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id
        if not self._admitted(str(peer)):
            self.refused += 1
            logger.debug("DCUtR stream from %s refused: not admitted", peer)
            await _reset(stream)
            return
        if peer in self._inbound or len(self._inbound) >= MAX_INBOUND_SESSIONS \
                or not self._has_room(peer):
            self.busy += 1
            await _reset(stream)
            return
        self._inbound.add(peer)
        try:
            await super()._handle_dcutr_stream(stream)
        finally:
            self._inbound.discard(peer)

    async def initiate_hole_punch(self, peer_id: ID) -> bool:
        if not self._admitted(str(peer_id)) or not self._has_room(peer_id):
            return False
        return await super().initiate_hole_punch(peer_id)

    def _decode_observed_addrs(self, addr_bytes: list[bytes]) -> list[Multiaddr]:
        taken: list[Multiaddr] = []
        for raw in addr_bytes:
            if len(taken) >= MAX_PUNCH_ADDRS:
                break
            try:
                addr = Multiaddr(raw)
                protos = [p.name for p in addr.protocols()]
            except Exception:  # noqa: BLE001, S112 - malformed bytes from a peer: skipped
                continue
            if protos[:2] in (["ip4", "tcp"], ["ip6", "tcp"]) and "p2p-circuit" not in protos:
                taken.append(addr)
        return taken

    # ------------------------------------------------------------------ what a punch opened
    async def _perform_hole_punch(self, peer_id: ID, addrs: list[Multiaddr],
                                  as_responder: bool = False) -> bool:
        ok = bool(await super()._perform_hole_punch(peer_id, addrs, as_responder))
        if ok:
            self._note(peer_id)
        return ok

    async def _try_unilateral_upgrade(self, peer_id: ID) -> bool:
        ok = bool(await super()._try_unilateral_upgrade(peer_id))
        if ok:
            self._note(peer_id)
        return ok

    def _note(self, peer: ID) -> None:
        direct = [c for c in self.host.get_network().connections.get(peer, []) if _is_direct(c)]
        if direct:
            self._punched[peer] = direct
            self.punches += 1

    # ------------------------------------------------------------------ the sweep
    def sweep(self) -> None:
        """Forget the peers that hold no connection now (and punched connections that
        closed); a peer mid-session keeps its entries."""
        conns = self.host.get_network().connections
        busy = self._in_progress | self._inbound
        for table in self._tables():
            for peer in [p for p in table if not conns.get(p) and p not in busy]:
                if isinstance(table, dict):
                    del table[peer]
                else:
                    table.discard(peer)
        for peer, mine in list(self._punched.items()):
            left = [c for c in mine if c in conns.get(peer, [])]
            if left:
                self._punched[peer] = left
            else:
                del self._punched[peer]

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sweep_forever)
            try:
                await super().run(task_status=task_status)
            finally:
                nursery.cancel_scope.cancel()

    async def _sweep_forever(self) -> None:
        while True:
            await trio.sleep(SWEEP_S)
            try:
                self.sweep()
            except Exception:  # a library table changing shape must not end the host
                logger.exception("DCUtR table sweep failed")


async def serve_hole_punch(service: HolePunch, *,
                           task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Run ``service`` until cancelled; ``task_status.started()`` once it answers."""
    async with background_trio_service(service):
        await service.event_started.wait()
        task_status.started()
        await trio.sleep_forever()


async def _reset(stream: INetStream) -> None:
    try:
        await stream.reset()
    except Exception as exc:  # noqa: BLE001 - already torn down
        logger.debug("resetting a DCUtR stream failed: %r", exc)
