"""The mends for py-libp2p 0.8.1's defects (measured and tabled in ``docs/transport.md``,
section "py-libp2p 0.8.1 defects"), numbered as the code cites them:

1. the inbound connection cap counts connections over the host's *lifetime* (a slot is
   held until the swarm ends), so it is raised far above anything a LAN node will see;
2. leaving ``host.run()`` closes nothing, so ``open_transport`` closes the host itself;
3. an exception in a stream handler kills the host, so every handler is wrapped and a
   failure resets only its own stream;
4. the dialler sleeps a fixed 250 ms "happy eyeballs" head start even when it has a single
   address, so that delay is set to zero (we always hand it the addresses we mean to use);
5. a failed dial puts the peer in a 60 s negative cache, which would ignore a fresh mDNS
   hint about a restarted peer, so an explicit dial clears that entry first;
6. the swarm's auto-connector re-dials every peerstore entry (up to 200 at a time) on each
   disconnect and every 30 s, undoing deliberate disconnects; it is switched off, because
   whom to dial and when is the gossip layer's policy;
7. its unhandled log records (ERROR tracebacks on routine disconnects) reach stderr through
   Python's last-resort handler; they are demoted to DEBUG records of our logger;
8. its connection limits (256 established inbound) count every authenticated peer alike and
   nothing ever closes an idle connection, so outsiders holding 256 throw-away keys locked
   members out: with an ``admit`` predicate (the daemon's: an active member), a connection
   from anyone else is closed right after the handshake (a few get one session on
   probation first, for a newcomer bringing the manifest that admits it), and admitted
   peers bypass the limits (the tracker's bypass hook), so their slots are always there;
9. it reuses an open connection however long its path has been gone, and closes none on
   its own (no keepalive, no ping): after a partition heals, a new stream on a connection
   that carried data during the cut waits for TCP's next retransmission (its timeout
   doubles up to 2 min; measured in the soak: 26 s after a 30 s cut), and after the host's
   address changes, its connections stay bound to the deleted address until TCP gives up
   (~15 min). Every libp2p TCP socket gets keepalive and TCP_USER_TIMEOUT (a bound:
   ``TCP_USER_TIMEOUT_S``), and the transport closes a connection that is stalled
   (:func:`stalled`, read from TCP_INFO) or bound to an address the host no longer has,
   before opening a stream on it and in a sweep every ``CONNECTION_SWEEP_S``, and a peer's
   connections when a stream to it cannot be opened, so the next stream goes over a fresh
   dial.

10 to 13 are the Noise + Yamux data path's (window updates on every read, a 256 KiB window,
two Noise messages and two ``send`` calls per 64 KiB frame, two ``recv`` calls per Noise
message, copies): :mod:`peerd.net.mends_throughput` owns them; 14 (the Yamux reader's
per-frame locks, cancel scopes, events and wake-ups) is :mod:`peerd.net.mends_throughput_rx`'s,
and :func:`apply_library_mends` installs them all. 15 (the library's per-peer tables, a remote
crash through them, and its own handlers' exceptions) is per host:
:class:`peerd.net.peertables.PeerTables`, installed by the transport.

Mends 2, 3 and 5 are steps of :mod:`peerd.net.transport`'s own flow (``open_transport``,
its stream handler, ``Transport.connect``), and so are mend 9's closes; mend 8's verdict is
:mod:`peerd.net.admission`'s. This module owns the rest: the process-wide patches of
py-libp2p's module state (4, 7, 9's socket options), the settings and hooks the transport
applies to each host it builds (1, 6, 8's limit bypass), mend 9's reading of a
connection's socket (:func:`socket_of`, :func:`stalled`, :func:`local_ip`, :func:`abort`);
the port probe before a host listens is :mod:`peerd.net.portprobe`'s (libp2p-free). It must
not hold a host, a connection or a stream (that is :mod:`peerd.net.transport` and
:mod:`peerd.net.stream`), nor decide who is admitted or which connection is dead
(:mod:`peerd.net.admission`, :mod:`peerd.net.liveness`).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from collections.abc import Callable
from typing import Any, Protocol

import libp2p.network.swarm as _libp2p_swarm
from libp2p.abc import INetwork
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID

from peerd.net import mends_throughput, mends_throughput_rx
from peerd.net.transport_config import (
    STALLED_PROBES,
    STALLED_RETRANSMITS,
    TCP_KEEPALIVE_IDLE_S,
    TCP_KEEPALIVE_INTERVAL_S,
    TCP_USER_TIMEOUT_S,
    TransportConfig,
)


def connection_config(config: TransportConfig) -> ConnectionConfig:
    """py-libp2p's connection settings for one host (mends 1 and 6)."""
    cap = config.max_lifetime_inbound_connections
    high = min(ConnectionConfig.high_watermark, cap)
    return ConnectionConfig(
        # The inbound slots are max_connections - min_connections (mend 1). With the
        # auto-connector off (mend 6) min/low watermarks mean nothing, so they are 0;
        # high_watermark keeps governing pruning of *live* connections.
        max_connections=cap,
        min_connections=0,
        low_watermark=0,
        high_watermark=high,
        dial_timeout=config.dial_timeout_s,
    )


def switch_off_auto_connector(swarm: INetwork) -> None:
    """Whom to dial, and when, is the gossip layer's decision (mend 6)."""
    swarm.auto_connector.maybe_connect = _no_auto_connect  # type: ignore[attr-defined]


async def _no_auto_connect() -> None:
    """Replaces the swarm's auto-connector (mend 6)."""


def bypass_limits_when_admitted(swarm: INetwork, admitted: Callable[[str], bool]) -> None:
    """Admitted peers skip py-libp2p's established-connection limits (per direction,
    per peer, total): however many outsiders connect, a member is never refused for
    want of a slot. Outsiders stay under the limits, and are closed besides (mend 8)."""
    manager = getattr(swarm, "_resource_manager", None)
    tracker = getattr(manager, "connection_tracker", None)
    if tracker is None:  # no resource manager: no limits to bypass
        return
    bypassed = tracker.is_bypassed

    def is_bypassed(peer_id: ID) -> bool:
        return bool(bypassed(peer_id)) or admitted(str(peer_id))

    tracker.is_bypassed = is_bypassed


_mends_applied = False


def apply_library_mends() -> None:
    """Process-wide fixes to py-libp2p 0.8.1 module state (idempotent; mends 4, 7, 9's
    socket options and 10 to 14)."""
    global _mends_applied
    if _mends_applied:
        return
    # Dialling one address still sleeps this head start before returning; we pass only
    # addresses we want tried in parallel anyway.
    if hasattr(_libp2p_swarm, "_HAPPY_EYEBALLS_DELAY"):
        _libp2p_swarm._HAPPY_EYEBALLS_DELAY = 0.0
    # libp2p's logger has no handler and propagate=False (unless LIBP2P_DEBUG is set), so
    # Python's last-resort handler prints its records to stderr: a routine disconnect
    # during identify logs several ERROR tracebacks into journald. Demote them to DEBUG
    # records of our own logger instead.
    if not os.environ.get("LIBP2P_DEBUG"):  # set: the user asked for libp2p's own output
        logging.getLogger("libp2p").addHandler(_DemoteToDebug())
    _tune_tcp_streams()  # mend 9
    mends_throughput.apply()  # mends 10 to 13
    mends_throughput_rx.apply()  # mend 14
    _mends_applied = True


class _DemoteToDebug(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            _libp2p_log.debug("%s %s: %s", record.levelname, record.name, record.getMessage())
        except Exception:  # noqa: BLE001 - logging.Handler's contract: hand it to handleError
            self.handleError(record)


# Named under the transport's logger, as docs/transport.md tells operators to look for it.
_libp2p_log = logging.getLogger("peerd.net.transport.libp2p")


# --- mend 9: connections that outlived their path ---------------------------------------


class _Sock(Protocol):
    """What mend 9 uses of a socket (a stdlib or a trio one)."""

    def setsockopt(self, level: int, option: int, value: int, /) -> None: ...
    def getsockopt(self, level: int, option: int, buflen: int, /) -> bytes: ...
    def getsockname(self) -> Any: ...
    def shutdown(self, how: int, /) -> None: ...


def tune_socket(sock: _Sock) -> None:
    """Keepalive and TCP_USER_TIMEOUT on one connection's socket (where the OS has them): a
    connection whose peer is gone ends within the bounds of peerd.net.transport_config
    instead of TCP's ~15 minutes."""
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", TCP_KEEPALIVE_IDLE_S),
                        ("TCP_KEEPINTVL", TCP_KEEPALIVE_INTERVAL_S),
                        ("TCP_USER_TIMEOUT", TCP_USER_TIMEOUT_S * 1000)):  # milliseconds
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), int(value)))
    for level, option, value in options:
        try:
            sock.setsockopt(level, option, value)
        except OSError as e:  # not TCP after all, or an OS without the option
            _libp2p_log.debug("socket option %d/%d not set: %r", level, option, e)


def _tune_tcp_streams() -> None:
    """Every TCP stream py-libp2p wraps (dialled and accepted) gets :func:`tune_socket`."""
    from libp2p.io.trio import TrioTCPStream

    original = TrioTCPStream.__init__

    def init(self: TrioTCPStream, stream: Any) -> None:
        original(self, stream)
        sock = getattr(stream, "socket", None)
        if sock is not None:
            tune_socket(sock)

    TrioTCPStream.__init__ = init  # type: ignore[method-assign]


#: The attributes that lead from a muxed connection down to its TCP socket in py-libp2p
#: 0.8.1, one per layer: Yamux .secured_conn, secure session .conn, Noise reader/writer
#: .conn, raw connection .stream, TrioTCPStream .stream, trio SocketStream .socket.
_DOWN = ("secured_conn", "conn", "stream", "socket")
_MAX_LAYERS = 8


def socket_of(muxed_conn: object) -> _Sock | None:
    """The TCP socket under one libp2p connection; None if it is not TCP (or is gone)."""
    obj: object = muxed_conn
    for _ in range(_MAX_LAYERS):
        if hasattr(obj, "getsockopt") and hasattr(obj, "getsockname"):
            return obj  # type: ignore[return-value]
        obj = next((v for v in (getattr(obj, n, None) for n in _DOWN) if v is not None), None)
        if obj is None:
            return None
    return None


#: struct tcp_info (linux/tcp.h) starts with u8 state, ca_state, retransmits, probes, backoff.
_TCP_INFO_HEAD = struct.Struct("5B")


def stalled(sock: _Sock) -> bool:
    """Whether data sent on ``sock`` has gone unacknowledged through STALLED_RETRANSMITS
    retransmission timeouts in a row, or STALLED_PROBES keepalive probes in a row (Linux
    TCP_INFO; False where it cannot be read)."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return False
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, 104)
    except OSError:
        return False
    if len(info) < _TCP_INFO_HEAD.size:
        return False
    _, _, retransmits, probes, _ = _TCP_INFO_HEAD.unpack_from(info)
    return bool(retransmits >= STALLED_RETRANSMITS or probes >= STALLED_PROBES)


def local_ip(sock: _Sock) -> str | None:
    """The local address ``sock`` is bound to (an IPv4-mapped IPv6 one as IPv4)."""
    try:
        name = sock.getsockname()
    except OSError:
        return None
    if not isinstance(name, tuple) or not name or not isinstance(name[0], str):
        return None
    host = name[0].split("%")[0]
    return host[7:] if host.startswith("::ffff:") and "." in host else host


def abort(sock: _Sock) -> None:
    """Shut ``sock`` down at once, both ways: a read or write blocked on it (py-libp2p's
    read loop, a stream waiting on the send buffer) fails now, so libp2p tears the
    connection down itself, and a close afterwards has nothing to wait for."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError as e:  # already shut down or never connected
        _libp2p_log.debug("shutting a socket down failed: %r", e)
