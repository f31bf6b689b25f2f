"""What `peerd run` settles once, before anything runs: the manifest it starts from, and the
transport settings its configuration implies (the per-peer byte budget).

Owns the start-up checks that need the daemon's modules (the manifest against the state)
and the pure derivations from the configuration; the checks that need neither torch nor
libp2p (lock, key, sockets, ports; :class:`DaemonError`) are :mod:`peerd.daemon.preflight`'s,
re-exported here. It decides nothing while the node runs (that is :mod:`peerd.daemon.daemon`'s
wiring and the stages it calls), and, like the daemon, must not parse wire bytes or touch
files itself: ``peerd.protocol`` checks manifests, ``peerd.store`` reads the state and the
configured manifest file.
"""

from __future__ import annotations

import logging

from peerd.core.entry import Schema
from peerd.daemon.config import Config

# Re-exported ("X as X"): the daemon and its stages import the start-up errors from here.
from peerd.daemon.preflight import DaemonError as DaemonError
from peerd.daemon.preflight import LateStartupError as LateStartupError
from peerd.daemon.preflight import check_listen as check_listen
from peerd.daemon.preflight import check_metrics_listen as check_metrics_listen
from peerd.daemon.preflight import preflight as preflight
from peerd.daemon.preflight import read_node_key as read_node_key
from peerd.net.transport import TransportConfig
from peerd.node.wirearrays import wire_schema
from peerd.protocol import messages as msg
from peerd.protocol.admission import entry_frame_limit
from peerd.protocol.envelope import SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.manifest import Manifest, accept_manifest, decode_manifest_file
from peerd.store import fleetdir, persist
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
