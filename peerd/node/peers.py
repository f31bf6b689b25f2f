"""The peer table: which peers a node knows, where they listen, and whom to dial next.

Discovery hints of members, static and bootstrap peers from the config, addresses exchanged
in sessions (``peerd.node.addrbook``) and members that dialled us feed it; the gossip loop
asks it which peers are due for a session (:meth:`PeerTable.due` reserves them, so a peer
never has two sessions of ours at once) and reports each session's outcome back. A peer
whose dial fails or whose session is refused is retried only after an exponential backoff
with jitter (:func:`backoff_s`), reset by its next good session. Entries unseen for
:data:`PEER_FORGET_S` are forgotten, except static and bootstrap ones (discovery and the
exchange re-add live peers); an mDNS goodbye forgets an mDNS peer at once; the table never
holds more than :data:`MAX_PEERS`. Everything here is a hint: the Noise handshake proves a
peer's id and the manifest its membership; the caller decides who may enter (members only,
see ``peerd.daemon.daemon``).

Pure: the time and the jitter's random source are passed in, nothing here does I/O, logs or
knows about trio, so every rule is tested without sockets. It must not import the transport,
discovery or the daemon.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

#: Peers unseen this long are dropped from the table (discovery re-adds live ones).
PEER_FORGET_S = 600.0
#: The start of a failure's message kept for ``peerd peers`` (exceptions can be long).
MAX_ERROR_LEN = 200
#: Peers held at once. Threat: a table fed from the network (mDNS records, inbound dials)
#: that grows with every fake identity, each dialled every sweep. The daemon lets in only
#: members (a manifest lists at most 400) and at most 256 static peers, so a fleet never
#: reaches this; it bounds what a node still without a manifest (it cannot tell members
#: yet) takes in. When full, the non-static peer seen longest ago makes room.
MAX_PEERS = 1024
#: The first retry after a failed dial or a refused session waits about this long; each
#: further failure doubles it (an unreachable or refused peer is not dialled every sweep).
BACKOFF_BASE_S = 5.0
#: The longest wait between two attempts (before jitter): a peer that comes back is tried
#: again within this, and a refused one costs at most ~12 sessions (audit lines) an hour.
BACKOFF_MAX_S = 300.0
#: The longest wait for a peer that already completed a session with us (a proven member)
#: and now merely cannot be reached. A partition or an address change cuts a member off for
#: a while, and nothing announces that the path is back: at BACKOFF_MAX_S the mesh would stay
#: split for minutes after healing (measured in the soak: 27 s median after a 30 s partition
#: with the full schedule). One connection attempt every few seconds to a known member costs
#: a SYN; refused peers and never-proven ones keep the full schedule.
BACKOFF_MEMBER_MAX_S = 5.0

#: Sessions a node starts per gossip sweep unless configured (``[network] fanout``). Each
#: node opening a session with every peer every sweep is O(N²) sessions across a fleet of N;
#: with a bounded fanout each node's cost per sweep is constant and a new version still
#: reaches the fleet in O(log N) sweeps, since every node that holds it passes it on
#: (memberlist/Serf use 3; gossipsub bounds its mesh degree the same way).
DEFAULT_FANOUT = 3

#: How we learned of a peer: an mDNS record, ``[network] static_peers``, ``[network]
#: bootstrap``, a member's signed address record handed on in a session (``exchanged``), or
#: it dialled us.
PeerSource = Literal["mdns", "static", "bootstrap", "exchanged", "inbound"]
#: Sources the table never forgets nor evicts: the operator named them.
_CONFIGURED: frozenset[str] = frozenset({"static", "bootstrap"})


def backoff_s(failures: int, rng: random.Random, cap: float = BACKOFF_MAX_S) -> float:
    """The wait before the next attempt after ``failures`` (>= 1) failures in a row:
    ``BACKOFF_BASE_S * 2**(failures - 1)`` capped at ``cap``, times a jitter in [0.5, 1] so
    that peers refused together do not come back together."""
    delay = min(cap, BACKOFF_BASE_S * 2.0 ** min(max(failures, 1) - 1, 32))
    return delay * rng.uniform(0.5, 1.0)


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
    #: Failed dials and refused sessions since its last good session (the backoff's exponent).
    failures: int = 0
    #: Not dialled before this time (backoff); None: no failure since the last good session.
    retry_at: float | None = None
    #: When its last session (ours or its own) completed; None: never. A bounded sweep
    #: dials the peers it has synchronised with longest ago first.
    last_session_at: float | None = None


class PeerTable:
    """The known peers of the node ``self_id`` (which is never one of them).

    ``rng`` jitters the backoff; by default a generator seeded with ``self_id``, so a node's
    schedule is reproducible and differs from its neighbours'.
    """

    def __init__(self, self_id: str, *, rng: random.Random | None = None) -> None:
        self.self_id = self_id
        self._peers: dict[str, Peer] = {}
        self._rng = rng if rng is not None else random.Random(self_id)

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
    def _make_room(self) -> bool:
        """Evict the non-static peer seen longest ago (none in a session) if the table is
        full; False when there is no room (every entry static or in a session)."""
        if len(self._peers) < MAX_PEERS:
            return True
        candidates = [p for p in self._peers.values()
                      if p.source not in _CONFIGURED and not p.in_session]
        if not candidates:
            return False
        del self._peers[min(candidates, key=lambda p: p.last_seen).id]
        return True

    def _enter(self, peer_id: str, addrs: Sequence[str], now: float,
               source: PeerSource) -> bool:
        """A peer not in the table yet, if there is room; True when it was entered."""
        if not self._make_room():
            return False
        self._peers[peer_id] = Peer(peer_id, tuple(addrs), now, source)
        return True

    def on_hint(self, peer_id: str, addrs: Sequence[str], now: float) -> bool:
        """A discovery record for ``peer_id`` at ``addrs``; True when the peer is new."""
        if peer_id == self.self_id:
            return False
        peer = self._peers.get(peer_id)
        if peer is None:
            return self._enter(peer_id, addrs, now, "mdns")
        if tuple(addrs) != peer.addrs:
            peer.retry_at = None  # it moved (restarted?): the new address is worth a try now
        peer.addrs, peer.last_seen = tuple(addrs), now
        if peer.source in ("inbound", "exchanged"):  # the LAN's own word is the better one
            peer.source = "mdns"
        return False

    def on_lost(self, peer_id: str) -> bool:
        """Discovery heard ``peer_id`` say goodbye (or its record expired): an mDNS peer is
        forgotten now rather than dialled at a dead address until :data:`PEER_FORGET_S`.
        Static peers stay, and so does one known from its own dial. True if it was dropped."""
        peer = self._peers.get(peer_id)
        if peer is None or peer.source != "mdns":
            return False
        del self._peers[peer_id]
        return True

    def add_static(self, multiaddrs: Iterable[str], now: float) -> None:
        """``[network] static_peers``: full multiaddrs ending in ``/p2p/<id>``."""
        for addr in multiaddrs:
            head, _, peer_id = addr.rpartition("/p2p/")
            if not peer_id or peer_id == self.self_id:
                continue
            if peer_id in self._peers or self._make_room():
                self._peers[peer_id] = Peer(peer_id, (head,), now, "static")

    def add_bootstrap(self, peer_id: str, addrs: Sequence[str], now: float) -> None:
        """A ``[network] bootstrap`` entry, its DNS name resolved to ``addrs``: kept like a
        static peer; a static entry of the same peer stays static. New addresses (a DNS name
        that now resolves elsewhere) are dialled at the next sweep."""
        if peer_id == self.self_id or not addrs:
            return
        peer = self._peers.get(peer_id)
        if peer is None:
            self._enter(peer_id, addrs, now, "bootstrap")
            return
        if peer.source == "static":
            return
        if tuple(addrs) != peer.addrs:
            peer.retry_at = None
        peer.addrs, peer.source = tuple(addrs), "bootstrap"

    def on_exchanged(self, peer_id: str, addrs: Sequence[str], now: float) -> bool:
        """A member's signed address record, handed on by a peer: a peer we did not know is
        entered (``exchanged``) and dialled; one that only dialled us gets its addresses.
        A peer known from mDNS or the config keeps what it was (the LAN's or the operator's
        address is the better one). True when the peer is new or newly dialable."""
        if peer_id == self.self_id or not addrs:
            return False
        peer = self._peers.get(peer_id)
        if peer is None:
            return self._enter(peer_id, addrs, now, "exchanged")
        if peer.source not in ("exchanged", "inbound"):
            return False
        fresh = peer.source == "inbound" or tuple(addrs) != peer.addrs
        if tuple(addrs) != peer.addrs:
            peer.retry_at = None
        peer.addrs, peer.source, peer.last_seen = tuple(addrs), "exchanged", now
        return fresh

    def reached(self, now: float, within: float) -> bool:
        """Whether a session with any peer completed in the last ``within`` seconds."""
        return any(p.last_session_at is not None and now - p.last_session_at <= within
                   for p in self._peers.values())

    def retry_bootstrap(self) -> None:
        """Nobody in reach: the bootstrap peers are dialled at the next sweep, backoff or not."""
        for peer in self._peers.values():
            if peer.source == "bootstrap":
                peer.retry_at = None

    def retry_via_relay(self, relay_id: str) -> int:
        """A reservation at ``relay_id`` is held again (the relay came back): the peers
        with a circuit through it are dialled at the next sweep, backoff or not; their
        dials failed while it was gone, which said nothing of them. How many."""
        via = f"/p2p/{relay_id}/p2p-circuit"
        woken = 0
        for peer in self._peers.values():
            if peer.retry_at is not None and any(a.endswith(via) for a in peer.addrs):
                peer.retry_at = None
                woken += 1
        return woken

    def add_inbound(self, peer_id: str, now: float) -> Peer | None:
        """A peer that dialled us and proved its membership in a session (never before: a
        stranger must not take a place in the table). The known entry if there is one;
        None if the table has no room."""
        peer = self._peers.get(peer_id)
        if peer is not None or peer_id == self.self_id:
            return peer
        if not self._make_room():
            return None
        peer = self._peers[peer_id] = Peer(peer_id, (), now, "inbound")
        return peer

    def forget(self, peer_id: str) -> None:
        self._peers.pop(peer_id, None)

    # -------------------------------------------------------------- sessions
    def due(self, now: float, fanout: int | None = None) -> list[Peer]:
        """One gossip sweep: forget peers unseen for :data:`PEER_FORGET_S` (static ones
        stay), and reserve and return the dialable peers without a session whose backoff
        has run out — at most ``fanout`` of them (None: all).

        With more candidates than ``fanout``, those never synchronised come first, then
        those whose last session (either side's) completed longest ago; equal ones in a
        random order. So every peer gets its turn within ``ceil(candidates / fanout)``
        sweeps (anti-entropy reaches everyone), while a peer that just dialled us is not
        dialled back for nothing.
        """
        candidates = []
        for peer in list(self._peers.values()):
            if now - peer.last_seen > PEER_FORGET_S and peer.source not in _CONFIGURED:
                del self._peers[peer.id]
            elif not peer.in_session and peer.addrs and (
                    peer.retry_at is None or now >= peer.retry_at):
                candidates.append(peer)
        if fanout is not None and len(candidates) > fanout:
            self._rng.shuffle(candidates)  # the random order among equals (sort is stable)
            candidates.sort(key=lambda p: -math.inf if p.last_session_at is None
                            else p.last_session_at)
            del candidates[max(fanout, 0):]
        for peer in candidates:
            peer.in_session = True  # reserved until the session ends: see release()
        return candidates

    def begin_session(self, peer_id: str) -> Peer | None:
        """A session with ``peer_id`` starts (ours, or one it opened): a known peer is not
        dialled meanwhile. An unknown one is not entered: see :meth:`add_inbound`."""
        peer = self._peers.get(peer_id)
        if peer is not None:
            peer.in_session = True
        return peer

    @staticmethod
    def completed(peer: Peer, now: float, error: str | None = None) -> None:
        """A session with a member ran to its end; ``error`` names what the peer sent that
        we refused. It is a sign of life: the backoff starts over."""
        peer.sessions += 1
        peer.last_seen = peer.last_session_at = now
        peer.last_error = error
        peer.failures, peer.retry_at = 0, None

    def failed(self, peer: Peer, error: str, now: float, *, refused: bool = False) -> None:
        """A dial or session failed (unreachable, timeout, transport error) or, with
        ``refused``, the peer was refused (not a member): shown by ``peerd peers``, and the
        next dial waits :func:`backoff_s` — at most :data:`BACKOFF_MEMBER_MAX_S` for a proven
        member that is only unreachable. A failure is no sign of life (``last_seen`` stays)."""
        peer.last_error = error[:MAX_ERROR_LEN]
        peer.failures += 1
        cap = BACKOFF_MEMBER_MAX_S if peer.sessions > 0 and not refused else BACKOFF_MAX_S
        peer.retry_at = now + backoff_s(peer.failures, self._rng, cap)

    def idle_connected(self, connected: Iterable[str], keep: int) -> list[str]:
        """The known peers among ``connected`` to disconnect so that at most ``keep`` known
        ones stay connected: the least recently synchronised first, never one in a session.

        A connection costs sockets, buffers and keepalives on both ends, and py-libp2p keeps
        every one it ever made: in a large fleet, where a bounded sweep meets different
        peers over time, a node would end up connected to all of them. Peers we don't know
        (strangers on probation) are the transport's admission's business, not counted here.
        """
        known = [p for p in (self._peers.get(pid) for pid in set(connected)) if p is not None]
        if len(known) <= keep:
            return []
        idle = sorted((p for p in known if not p.in_session),
                      key=lambda p: (-math.inf if p.last_session_at is None
                                     else p.last_session_at, p.id))
        return [p.id for p in idle[:len(known) - max(keep, 0)]]

    @staticmethod
    def release(peer: Peer) -> None:
        """The session (or the reserved dial) is over: the peer may be due again."""
        peer.in_session = False
