"""The transport's settings, limits, deadlines and per-peer counters (no libp2p here).

:mod:`peerd.transport` runs the libp2p host under these and re-exports what callers use;
keeping the plain-Python parts apart keeps that module (the only one importing libp2p)
about the host itself.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey as CryptoEd25519PrivateKey,
)

from peerd.framing import TransportError

PROTOCOL_ID = "/peerd/cache/1.0.0"

# --- limits and deadlines (framing's own are in peerd.framing) --------------------------

#: Lifetime inbound-connection budget. py-libp2p sizes its inbound limiter as
#: max_connections - min_connections and never returns a slot while the host runs; at the
#: default (250) a node stops accepting anyone after 250 reconnects. 10**6 reconnects at
#: ~15 KB leaked each is ~15 GB, i.e. the daemon would be restarted long before this bites.
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
#: Peers whose counters we keep; identities cost nothing to mint, so entries of peers
#: that are gone (no connection, no stream) are dropped beyond this, oldest first.
MAX_TRACKED_PEERS = 4096


class StreamLimitError(TransportError):
    """Too many concurrent outbound streams to one peer."""


@dataclass
class PeerStats:
    """Per-peer counters for ``peerd status`` (application bytes through framed I/O)."""

    bytes_in: int = 0
    bytes_out: int = 0
    streams_in: int = 0  # currently open inbound streams
    streams_out: int = 0  # currently open outbound streams
    streams_rejected: int = 0  # inbound streams reset for exceeding the per-peer limit
    handler_errors: int = 0  # inbound handlers that raised or timed out
    last_seen: float = 0.0  # wall-clock time of the last byte or connection event


@dataclass(frozen=True)
class TransportConfig:
    listen_host: str = "0.0.0.0"  # noqa: S104 - a LAN daemon listens on all interfaces
    listen_port: int = 0  # 0 = ephemeral; see peerd.transport.Transport.port
    max_inbound_streams_per_peer: int = MAX_INBOUND_STREAMS_PER_PEER
    max_outbound_streams_per_peer: int = MAX_OUTBOUND_STREAMS_PER_PEER
    handler_timeout_s: float = HANDLER_TIMEOUT_S
    dial_timeout_s: float = DIAL_TIMEOUT_S
    max_lifetime_inbound_connections: int = MAX_LIFETIME_INBOUND_CONNECTIONS


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


def check_port_free(host: str, port: int) -> None:
    """Fail if another socket listens on ``host:port``.

    py-libp2p listens with SO_REUSEPORT (for hole punching), so a second daemon on the same
    port would not fail: the kernel would split inbound connections between the two. A
    probe bound *without* SO_REUSEPORT gets EADDRINUSE while any listener holds the port.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # REUSEADDR only: TIME_WAIT leftovers from our own previous run are no conflict.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise TransportError(f"cannot listen on {host}:{port}: {e.strerror}") from e
