"""The start-up checks `peerd run` makes before it reads state or listens: the state
directory's lock, the node's key, the control socket and the listen addresses.

Apart from :mod:`peerd.daemon.startup` because none of them needs torch or libp2p: the
command loads the config and runs these before it imports the daemon (4 to 5 s of CPU), so a
config typo or a port in use is one line on stderr and exit status 2 in a fraction of a
second, however often systemd retries. Importing torch, libp2p or the daemon here would undo
that; ``tests/cli/test_startup_failures.py`` checks it. Like the daemon, this module must not
touch files itself: ``peerd.store`` reads the key and holds the lock.
"""

from __future__ import annotations

import errno
import logging

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.control.metrics import parse_listen
from peerd.control.server import ControlError, check_socket_free
from peerd.daemon.config import Config
from peerd.net.framing import TransportError
from peerd.net.portprobe import check_port_free
from peerd.store import lock as state_lock
from peerd.store.keyfile import NODE_KEY_FILE, KeyFileError, read_private_key

# Logged as the daemon: start-up is a phase of `peerd run`; its records keep that name.
log = logging.getLogger("peerd.daemon.daemon")


class DaemonError(RuntimeError):
    """Start-up cannot proceed (missing key, bad manifest…); the message says how to fix it."""


class LateStartupError(DaemonError):
    """Start-up work that finishes after READY=1 failed (the task's data, mDNS): still a
    start-up failure, one line and exit status 2 (``cli/run.py``), not a crash."""


def read_node_key(cfg: Config) -> Ed25519PrivateKey:
    """The node's identity key, from its state directory."""
    key_path = cfg.node.state_dir / NODE_KEY_FILE
    if not key_path.exists():
        raise DaemonError(f"no identity key at {key_path}: create one with "
                          f"`peerd keygen --state-dir {cfg.node.state_dir}`")
    try:
        return read_private_key(key_path)
    except KeyFileError as exc:
        raise DaemonError(f"identity key unusable: {exc}") from None


def preflight(cfg: Config) -> state_lock.StateLock:
    """Everything `peerd run` can check before it reads state or listens, each failure a
    :class:`DaemonError` (one line, exit status 2): the state directory's lock first (so a
    second daemon touches nothing of the first's), then the key, the control socket and the
    listen address. Returns the lock; the caller holds it for the daemon's lifetime.
    First logs the config's deprecation notices, one warning line each."""
    for line in cfg.deprecations:
        log.warning("%s: %s", cfg.source or "config", line)
    node = cfg.node
    try:
        held = state_lock.acquire(node.state_dir, socket=node.control_socket)
    except state_lock.StateLockError as exc:
        raise DaemonError(str(exc)) from None
    try:
        read_node_key(cfg)
        try:
            check_socket_free(node.control_socket)
        except ControlError as exc:
            raise DaemonError(f"control socket: {exc.message}") from None
        check_listen(cfg.network.listen_host, cfg.network.listen_port)
        if cfg.network.metrics_listen is not None:
            check_metrics_listen(cfg.network.metrics_listen)
    except BaseException:
        held.release()
        raise
    return held


def check_metrics_listen(listen: str) -> None:
    """The Prometheus endpoint's ``HOST:PORT`` is free (it is bound before the host listens,
    but after the state is restored: checked here so that failure is one line too)."""
    host, port = parse_listen(listen)
    try:
        check_port_free(host, port)
    except TransportError as exc:
        cause = exc.__cause__
        why = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(exc)
        raise DaemonError(f"[network] metrics_listen {listen}: {why}") from None


def check_listen(host: str, port: int) -> None:
    """``host:port`` can be listened on: ``host`` is an address of this machine and no other
    socket holds the port (port 0: any free one, so only the address is checked)."""
    try:
        check_port_free(host, port)
    except TransportError as exc:
        cause = exc.__cause__
        code = cause.errno if isinstance(cause, OSError) else None
        if code == errno.EADDRNOTAVAIL:
            raise DaemonError(f"[network] listen_host {host} is not an address of this "
                              "machine: use one of its addresses, or 0.0.0.0 for all") from None
        if code == errno.EADDRINUSE:
            raise DaemonError(f"[network] listen_port {port} is already in use on {host}: "
                              "another program (or peerd) holds it; set another listen_port, "
                              "or 0 for any free port") from None
        raise DaemonError(f"[network] {exc}") from None
