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
   peers bypass the limits (the tracker's bypass hook), so their slots are always there.

Mends 2, 3 and 5 are steps of :mod:`peerd.net.transport`'s own flow (``open_transport``,
its stream handler, ``Transport.connect``), and mend 8's verdict is
:mod:`peerd.net.admission`'s. This module owns the rest: the process-wide patches of
py-libp2p's module state (4, 7), the settings and hooks the transport applies to each host
it builds (1, 6, 8's limit bypass), and the port probe before a host listens (py-libp2p's
listener sets SO_REUSEPORT). It must not hold a host, a connection or a stream (that is
:mod:`peerd.net.transport` and :mod:`peerd.net.stream`), nor decide who is admitted.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

import libp2p.network.swarm as _libp2p_swarm
from libp2p.abc import INetwork
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID

from peerd.net.framing import TransportError
from peerd.net.transport_config import TransportConfig


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
    """Process-wide fixes to py-libp2p 0.8.1 module state (idempotent; mends 4 and 7)."""
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
    _mends_applied = True


class _DemoteToDebug(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            _libp2p_log.debug("%s %s: %s", record.levelname, record.name, record.getMessage())
        except Exception:  # noqa: BLE001 - logging.Handler's contract: hand it to handleError
            self.handleError(record)


# Named under the transport's logger, as docs/transport.md tells operators to look for it.
_libp2p_log = logging.getLogger("peerd.net.transport.libp2p")


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
