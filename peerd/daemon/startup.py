"""What `peerd run` settles once, before anything runs: the node's key, the manifest it starts
from, and the transport settings its configuration implies (the per-peer byte budget).

Owns the start-up checks that stop the daemon with a message saying how to fix it
(:class:`DaemonError`) and the pure derivations from the configuration. It decides nothing
while the node runs (that is :mod:`peerd.daemon.daemon`'s wiring and the stages it calls),
and, like the daemon, must not parse wire bytes or touch files itself: ``peerd.protocol``
checks manifests, ``peerd.store`` reads the key, the state and the configured manifest file.
"""

from __future__ import annotations

import errno
import logging

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.control.metrics import parse_listen
from peerd.control.server import ControlError, check_socket_free
from peerd.core.entry import Schema
from peerd.daemon.config import Config
from peerd.net.mends import check_port_free
from peerd.net.transport import TransportConfig, TransportError
from peerd.node.state import wire_schema
from peerd.protocol import messages as msg
from peerd.protocol.admission import entry_frame_limit
from peerd.protocol.envelope import SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.manifest import Manifest, accept_manifest, decode_manifest_file
from peerd.store import fleetdir, persist
from peerd.store import lock as state_lock
from peerd.store.keyfile import NODE_KEY_FILE, KeyFileError, read_private_key
from peerd.store.statedir import StateDir

# Logged as the daemon: start-up is a phase of `peerd run`; its records keep that name.
log = logging.getLogger("peerd.daemon.daemon")

#: Hello, manifest, digests, wants and announcements of one session (each frame is capped at
#: MAX_CONTROL_FRAME_LEN, the manifest at MAX_MANIFEST_FRAME_LEN; in practice a few KB, a
#: manifest of 1,000 members ~90 KB), budgeted on top of the entries.
SESSION_CONTROL_BYTES = 1024 * 1024


def peer_byte_budget(cfg: Config, schema: Schema) -> tuple[float, int]:
    """(bytes/s, burst) each peer may move in each direction.

    The burst is one complete session: C + 1 entries of the largest size this schema allows,
    plus control frames, so an honest exchange is never cut off. The automatic rate is twice
    what an honest peer can need, that whole session once per round interval.
    """
    session = ((cfg.learning.capacity + 1) * entry_frame_limit(wire_schema(schema))
               + SESSION_CONTROL_BYTES)
    if cfg.network.peer_bytes_per_s is not None:
        return float(cfg.network.peer_bytes_per_s), session
    return 2.0 * session / cfg.learning.round_interval_s, session


def transport_config(cfg: Config, schema: Schema) -> TransportConfig:
    """The transport's settings: where to listen, and each peer's byte budget."""
    rate, burst = peer_byte_budget(cfg, schema)
    log.info("per-peer byte budget: %.1f MB/s sustained, %.1f MB burst, each direction",
             rate / 1e6, burst / 1e6)
    return TransportConfig(listen_host=cfg.network.listen_host,
                           listen_port=cfg.network.listen_port,
                           peer_bytes_per_s=rate, peer_burst_bytes=burst)


#: The seq of the empty manifest a node without one starts from: every real manifest
#: (``peerd fleet init`` signs seq 1) is newer.
PLACEHOLDER_SEQ = 0


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


def load_manifest(
    cfg: Config, state: StateDir
) -> tuple[Manifest, msg.ManifestMessage | None]:
    """The configured manifest file, or a newer one adopted from peers earlier.

    With no ``[fleet] manifest`` and none adopted yet, the node starts with an empty
    placeholder (seq 0, no members): the first peer it meets sends the fleet's manifest,
    which is adopted only if the admin key signed it. Until then every entry is refused as
    ``not_member``, so nothing unverified is learned in the meantime.
    """
    admin, fleet = cfg.fleet.admin_public_key, cfg.fleet.fleet_id
    best: tuple[Manifest, msg.ManifestMessage] | None = None
    sources: list[tuple[str, SignedEnvelope]] = []
    # Logged only if a usable manifest is found after all; otherwise they are the reason of
    # the one-line start-up error.
    problems: list[str] = []
    stored = persist.load_manifest(state)
    if stored is not None:
        try:
            sources.append(("state", decode_manifest_file(stored)))
        except ProtocolError as exc:
            problems.append(f"manifest from state not used: {exc}")
    if cfg.fleet.manifest is not None:
        try:  # read with the protocol's size limit (peerd.store.fleetdir)
            sources.append((str(cfg.fleet.manifest),
                            fleetdir.read_manifest_envelope(cfg.fleet.manifest)))
        except fleetdir.ManifestError as exc:
            problems.append(str(exc))
        except fleetdir.FleetDirError as exc:  # unreadable: the operator must fix the path
            raise DaemonError(str(exc)) from exc
    for name, envelope in sources:
        try:
            manifest = accept_manifest(best[0] if best else None, envelope, admin, fleet)
            best = (manifest, msg.ManifestMessage(envelope))
        except ProtocolError as exc:
            problems.append(f"manifest from {name} not used: {exc}")
    if best is None and cfg.fleet.manifest is not None:
        raise DaemonError(f"no valid fleet manifest in {cfg.fleet.manifest} "
                          f"({'; '.join(problems)}): use the file written by "
                          "`peerd fleet init/admit` (signed by the fleet's admin key)")
    for problem in problems:
        log.warning("%s", problem)
    if best is None:  # and no [fleet] manifest configured
        log.warning("no fleet manifest yet ([fleet] manifest is unset): learning it from the "
                    "first peer met; entries are refused until then")
        return Manifest(fleet, PLACEHOLDER_SEQ), None
    return best
