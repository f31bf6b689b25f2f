"""The peer table: which peers a node knows, where they listen, and whom to dial next.

Discovery hints, static peers from the config and peers that dialled us feed it; the gossip
loop asks it which peers are due for a session (:meth:`PeerTable.due` reserves them, so a peer
never has two sessions of ours at once) and reports each session's outcome back. Entries
unseen for :data:`PEER_FORGET_S` are forgotten, except static ones (discovery re-adds live
peers). Everything here is a hint: the Noise handshake proves a peer's id and the manifest
its membership.

Pure: the time is passed in and nothing here does I/O, logs or knows about trio, so every
rule is tested without sockets. It must not import the transport, discovery or the daemon.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

#: Peers unseen this long are dropped from the table (discovery re-adds live ones).
PEER_FORGET_S = 600.0
#: The start of a failure's message kept for ``peerd peers`` (exceptions can be long).
MAX_ERROR_LEN = 200

#: How we learned of a peer: an mDNS record, ``[network] static_peers``, or it dialled us.
PeerSource = Literal["mdns", "static", "inbound"]


@dataclass(slots=True)
class Peer:
    """One known peer; the table changes it, the daemon and the status read it."""

    id: str
    addrs: tuple[str, ...]  # multiaddrs without /p2p/; empty: we cannot dial it (inbound)
    last_seen: float
    source: PeerSource
    #: A session of ours with it runs (or a dial is reserved): no second one is started.
    in_session: bool = False
    sessions: int = 0  # completed sessions
    last_error: str | None = None


class PeerTable:
    """The known peers of the node ``self_id`` (which is never one of them)."""

    def __init__(self, self_id: str) -> None:
        self.self_id = self_id
        self._peers: dict[str, Peer] = {}

    # -------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._peers

    def __iter__(self) -> Iterator[Peer]:
        return iter(list(self._peers.values()))

    def get(self, peer_id: str) -> Peer | None:
        return self._peers.get(peer_id)

    def ids(self) -> frozenset[str]:
        return frozenset(self._peers)

    # -------------------------------------------------------------- learning of peers
    def on_hint(self, peer_id: str, addrs: Sequence[str], now: float) -> bool:
        """A discovery record for ``peer_id`` at ``addrs``; True when the peer is new."""
        if peer_id == self.self_id:
            return False
        peer = self._peers.get(peer_id)
        if peer is None:
            self._peers[peer_id] = Peer(peer_id, tuple(addrs), now, "mdns")
            return True
        peer.addrs, peer.last_seen = tuple(addrs), now
        if peer.source == "inbound":  # it dialled us first; now we know where it lives
            peer.source = "mdns"
        return False

    def add_static(self, multiaddrs: Iterable[str], now: float) -> None:
        """``[network] static_peers``: full multiaddrs ending in ``/p2p/<id>``."""
        for addr in multiaddrs:
            head, _, peer_id = addr.rpartition("/p2p/")
            if not peer_id or peer_id == self.self_id:
                continue
            self._peers[peer_id] = Peer(peer_id, (head,), now, "static")

    # -------------------------------------------------------------- sessions
    def due(self, now: float) -> list[Peer]:
        """One gossip sweep: forget peers unseen for :data:`PEER_FORGET_S` (static ones
        stay), and reserve and return every other dialable peer without a session."""
        reserved = []
        for peer in list(self._peers.values()):
            if now - peer.last_seen > PEER_FORGET_S and peer.source != "static":
                del self._peers[peer.id]
            elif not peer.in_session and peer.addrs:
                peer.in_session = True  # reserved until the session ends: see release()
                reserved.append(peer)
        return reserved

    def begin_session(self, peer_id: str, now: float) -> Peer:
        """A session with ``peer_id`` starts (ours or one it opened: then it is learned as
        ``inbound``, without an address to dial)."""
        peer = self._peers.setdefault(peer_id, Peer(peer_id, (), now, "inbound"))
        peer.in_session = True
        return peer

    @staticmethod
    def completed(peer: Peer, now: float, error: str | None = None) -> None:
        """A session ran to its end; ``error`` names what the peer sent that we refused."""
        peer.sessions += 1
        peer.last_seen = now
        peer.last_error = error

    @staticmethod
    def failed(peer: Peer, error: str) -> None:
        """A dial or session failed (timeout, transport error): shown by ``peerd peers``."""
        peer.last_error = error[:MAX_ERROR_LEN]

    @staticmethod
    def release(peer: Peer) -> None:
        """The session (or the reserved dial) is over: the peer may be due again."""
        peer.in_session = False
