"""The transport's settings, limits, deadlines and per-peer counters, as plain Python.

:mod:`peerd.net.transport` runs the libp2p host under these and re-exports what callers use;
keeping the plain-Python parts apart keeps that module (with :mod:`peerd.net.stream` and
:mod:`peerd.net.mends`, the only ones importing libp2p) about the host itself. This module
must not import libp2p nor open sockets (the port probe is one of the mends, in
:mod:`peerd.net.mends`); its only I/O is reading the clock.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey as CryptoEd25519PrivateKey,
)

from peerd.net.framing import TransportError

PROTOCOL_ID = "/peerd/cache/1.0.0"

# --- limits and deadlines (framing's own are in peerd.net.framing) --------------------------

#: Inbound-connection budget. py-libp2p sizes its inbound limiter as max_connections -
#: min_connections and returned a slot only when the host ended, so at its default (250) a
#: node stopped accepting anyone after 250 reconnects (mend 1 raised it this far). Since
#: mend 15 a slot comes back when its connection closes, so this now bounds connections
#: held at once (admission, mend 8, closes outsiders' long before); the name is kept for
#: the config it is part of.
MAX_LIFETIME_INBOUND_CONNECTIONS = 1_000_000
#: Connect + Noise handshake + Yamux negotiation; bounds a peer (or a closed/filtered port)
#: that accepts TCP and then stalls, so a dial never blocks gossip indefinitely.
DIAL_TIMEOUT_S = 10.0
#: Opening a stream (multistream-select of our protocol) on an existing connection.
STREAM_OPEN_TIMEOUT_S = 10.0
#: Closing/resetting one stream; a peer that never acknowledges cannot hold us.
STREAM_CLOSE_TIMEOUT_S = 5.0
#: Closing the whole host (all connections) at shutdown; systemd waits 90 s by default.
HOST_CLOSE_TIMEOUT_S = 10.0
#: Closing connections to one peer on request.
DISCONNECT_TIMEOUT_S = 5.0
#: Whole lifetime of one inbound stream handler; a peer cannot pin a handler task forever.
HANDLER_TIMEOUT_S = 600.0
#: Concurrent inbound streams one peer may hold; more are reset at once (stream floods).
MAX_INBOUND_STREAMS_PER_PEER = 8
#: Concurrent outbound streams we open to one peer (keeps our own gossip from piling up).
MAX_OUTBOUND_STREAMS_PER_PEER = 8
#: Connections of peers that are not admitted (not members) held at once, each for one
#: session: a newcomer admitted by a manifest we have not seen yet brings it in its first
#: session (protocol/session.py). Threat: outsiders holding every inbound slot with
#: throw-away keys (py-libp2p allows 256); beyond these few, such a connection is closed
#: right after its handshake.
MAX_PROBATION_CONNECTIONS = 4
#: The longest a connection on probation stays open unless its peer gets admitted: Hellos
#: and a manifest frame (the gossip layer gives a stranger 5 s for the manifest it claims).
PROBATION_S = 10.0
#: After a refusal (Hello + ``error`` written, the stream half-closed) the connection of a
#: peer that is not admitted stays open this long at most for the peer to read it and hang
#: up, its bytes read and dropped meanwhile: closed at once, the peer's late bytes drew a RST
#: and its libp2p dropped the frames it had not yet read (issue 27: 9 of 142 js-libp2p
#: sessions). Threat: a stranger holding a connection; it cannot hold one longer than this
#: past its refusal (nor past PROBATION_S), nor send more than REFUSAL_LINGER_BYTES on the
#: refused stream meanwhile (more, and the stream is reset and the connection closed).
REFUSAL_LINGER_S = 2.0
REFUSAL_LINGER_BYTES = 64 * 1024
#: Closing one refused connection (its streams are reset, the remote gets a GoAway).
CLOSE_REFUSED_TIMEOUT_S = 5.0
#: Mend 9 (peerd.net.mends): a TCP connection whose path is gone (a partition, our own
#: address deleted) is aborted by the kernel once data sent on it has gone unacknowledged
#: this long (TCP_USER_TIMEOUT). Threat: libp2p reusing such a connection for every new
#: stream, each waiting on TCP's retransmission backoff (Linux gives up after ~15 min). A
#: peer that still acknowledges (slow, or its receive window shut) is not cut by it.
TCP_USER_TIMEOUT_S = 20.0
#: An idle connection is probed after this long without traffic (TCP keepalive), then every
#: TCP_KEEPALIVE_INTERVAL_S; with TCP_USER_TIMEOUT_S, an idle connection whose peer is gone
#: is closed within TCP_KEEPALIVE_IDLE_S + TCP_USER_TIMEOUT_S. Short, because a session's
#: responder waiting for its peer's next frame sends nothing: when a NAT on the path forgets
#: its mapping (a router restart, ``conntrack -F``), the peer's FIN or RST is dropped and the
#: session held the peer for 15-16 s (docs/reliability.md, NAT rebinding: 3 of 20 sessions at
#: 15 s idle). The first probe re-creates the mapping and draws the peer's ACK (the path
#: lives) or RST (the peer closed: the session ends at once). Cost: a connection idle this
#: long gets one 66-byte probe and its ACK per TCP_KEEPALIVE_IDLE_S; a gossiped-with peer
#: sees a session every sweep (3 s mean) anyway.
TCP_KEEPALIVE_IDLE_S = 3.0
TCP_KEEPALIVE_INTERVAL_S = 1.0
#: Keepalive (or zero-window) probes unanswered in a row (TCP_INFO's ``probes``) after which a
#: connection counts as stalled. A live peer's kernel answers each probe however busy its
#: process is, and only an idle connection is probed, so three unanswered (the last sent 2 s
#: after the first) mean a silent path (a NAT that drops instead of re-mapping, a cable
#: pulled) that TCP_USER_TIMEOUT_S alone would wait out for 20 s; a path whose round trip
#: exceeds 2 s (a saturated, bufferbloated uplink) may be cut too, and the next stream dials
#: afresh.
STALLED_PROBES = 3
#: Consecutive retransmission timeouts with no acknowledgement (TCP_INFO's ``retransmits``)
#: after which a connection counts as stalled and is closed rather than reused: at Linux's
#: 200 ms minimum RTO, 4 in a row are 3 s without a single ACK, which a live LAN path never
#: shows; its streams are then opened on a fresh connection (a new dial) instead.
STALLED_RETRANSMITS = 4
#: Seconds between two sweeps over the open connections, closing those stalled or bound to
#: an address the host no longer has (mend 9). One sweep: a getifaddrs(3) call and one
#: getsockopt per connection.
CONNECTION_SWEEP_S = 2.0
#: Peers whose counters we keep; identities cost nothing to mint, so entries of peers
#: that are gone (no connection, no stream) are dropped beyond this, oldest first.
MAX_TRACKED_PEERS = 4096
#: Peers py-libp2p's peerstore may hold (mend 15, peerd.net.peertables): every member of
#: the largest manifest (MAX_MEMBERS, 1,024) plus as many again for outsiders connected at
#: the moment. Threat: throw-away identities growing the library's tables; its own cap
#: (1,000) evicted the host's own entry, and identify then crashed the host.
MAX_LIBRARY_PEERS = 2048


class StreamLimitError(TransportError):
    """Too many concurrent outbound streams to one peer."""


class PeerBudgetError(TransportError):
    """A peer used up its byte budget in one direction; its streams wait for the refill."""


@dataclass
class ByteBudget:
    """A token bucket over bytes: refills at ``rate`` bytes/s, holds at most ``burst``.

    The stream checks :meth:`available` before each read or write and charges what
    moved afterwards, so a peer overdraws by at most one read chunk; while the balance is
    not positive its streams are refused. Time comes in as an argument (monotonic seconds).
    """

    rate: float
    burst: float
    balance: float = math.nan  # starts full
    stamp: float | None = None

    def __post_init__(self) -> None:
        if not (self.rate > 0 and self.burst > 0):
            raise ValueError("a byte budget needs a positive rate and burst")
        if math.isnan(self.balance):
            self.balance = self.burst

    def _refill(self, now: float) -> None:
        if self.stamp is not None and now > self.stamp:
            self.balance = min(self.burst, self.balance + (now - self.stamp) * self.rate)
        self.stamp = now if self.stamp is None else max(self.stamp, now)

    def available(self, now: float) -> bool:
        self._refill(now)
        return self.balance > 0

    def charge(self, n: int, now: float) -> None:
        self._refill(now)
        self.balance -= n

    def wait_s(self, now: float) -> float:
        """Seconds until :meth:`available` turns true again."""
        self._refill(now)
        return 0.0 if self.balance > 0 else (1 - self.balance) / self.rate


@dataclass
class PeerStats:
    """Per-peer counters for ``peerd status`` (application bytes through framed I/O)."""

    bytes_in: int = 0
    bytes_out: int = 0
    streams_in: int = 0  # currently open inbound streams
    streams_out: int = 0  # currently open outbound streams
    streams_rejected: int = 0  # inbound streams reset for exceeding the per-peer limit
    handler_errors: int = 0  # inbound handlers that raised or timed out
    budget_refusals: int = 0  # reads, writes and streams refused: byte budget spent
    last_seen: float = 0.0  # wall-clock time of the last byte or connection event
    #: What this peer may still send us / we may still send it (None: unlimited).
    budget_in: ByteBudget | None = field(default=None, repr=False)
    budget_out: ByteBudget | None = field(default=None, repr=False)

    def check_budget(self, budget: ByteBudget | None, what: str) -> None:
        """Count and raise :class:`PeerBudgetError` if ``budget`` (one of ours) is spent."""
        now = time.monotonic()
        if budget is not None and not budget.available(now):
            self.budget_refusals += 1
            raise PeerBudgetError(
                f"{what} spent ({budget.rate / 1e6:.1f} MB/s, burst {budget.burst / 1e6:.1f} "
                f"MB); refills in {budget.wait_s(now):.0f} s")

    def moved(self, n: int, *, inbound: bool) -> None:
        """Account ``n`` bytes read (``inbound``) or written: counters, last seen, budget."""
        if inbound:
            self.bytes_in += n
        else:
            self.bytes_out += n
        self.last_seen = time.time()
        budget = self.budget_in if inbound else self.budget_out
        if budget is not None:
            budget.charge(n, time.monotonic())


@dataclass(frozen=True)
class TransportConfig:
    listen_host: str = "0.0.0.0"  # noqa: S104 - a LAN daemon listens on all interfaces
    listen_port: int = 0  # 0 = ephemeral; see peerd.net.transport.Transport.port
    max_inbound_streams_per_peer: int = MAX_INBOUND_STREAMS_PER_PEER
    max_outbound_streams_per_peer: int = MAX_OUTBOUND_STREAMS_PER_PEER
    handler_timeout_s: float = HANDLER_TIMEOUT_S
    dial_timeout_s: float = DIAL_TIMEOUT_S
    max_lifetime_inbound_connections: int = MAX_LIFETIME_INBOUND_CONNECTIONS
    max_probation_connections: int = MAX_PROBATION_CONNECTIONS
    probation_s: float = PROBATION_S
    #: Per-peer byte budget, each direction on its own: sustained bytes/s and the most that
    #: may move at once. Bounds what one member (compromised, or just buggy) can make us
    #: receive, hash and verify, or upload to it, over a metered link. None = unlimited.
    peer_bytes_per_s: float | None = None
    peer_burst_bytes: int | None = None

    def new_peer_stats(self) -> PeerStats:
        if self.peer_bytes_per_s is None:
            return PeerStats()
        burst = float(self.peer_burst_bytes or self.peer_bytes_per_s)
        return PeerStats(budget_in=ByteBudget(self.peer_bytes_per_s, burst),
                         budget_out=ByteBudget(self.peer_bytes_per_s, burst))


# --- identity and addresses ------------------------------------------------------------

IdentityKey = CryptoEd25519PrivateKey | bytes


def seed_of(key: IdentityKey) -> bytes:
    """The 32-byte Ed25519 seed of ``key`` (the form libp2p's key pair is built from)."""
    if isinstance(key, CryptoEd25519PrivateKey):
        return key.private_bytes_raw()
    if isinstance(key, bytes) and len(key) == 32:
        return key
    raise ValueError("identity must be an Ed25519PrivateKey or its 32-byte seed")


def tcp_multiaddr(host: str, port: int) -> str:
    """``/ip4/H/tcp/P`` or ``/ip6/H/tcp/P`` for an address from discovery or config."""
    proto = "ip6" if ":" in host else "ip4"
    return f"/{proto}/{host}/tcp/{port}"

