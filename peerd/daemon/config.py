"""The daemon's configuration: a TOML file parsed into frozen, validated dataclasses.

Every setting has a default, so a file holding only ``[fleet]`` (the admin public key and the
fleet id) starts a working node. Unknown sections or keys and bad values stop start-up with a
:class:`ConfigError` naming the key (``[learning] capacity: must be an integer >= 0, got -1``):
a typo must never silently fall back to a default.

Key encoding: ``admin_public_key`` and ``fleet_id`` are lowercase **hex**, exactly as
``peerd fleet init`` prints them and writes them to ``fleet.json``.

The reference of every key lives in ``docs/operations.md``; ``systemd/peerd.toml.example``
is a commented file that this module accepts (a test keeps them in step).

It only reads the file it is given and must not import torch, libp2p or trio: ``peerd
status`` loads it (hence ``peerd.core.limits``, not ``peerd.core.validate``).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from peerd.control.status import ConfigStatus

# peerd.core.limits, not peerd.core.validate (torch): `peerd status` loads this module.
from peerd.core.limits import ValidationLimits
from peerd.core.modes import ModeName
from peerd.core.updatenorm import NormAction, UpdateNormPolicy
from peerd.daemon import config_limits as lim
from peerd.daemon.config_checks import (
    BadValueError,
    Check,
    check_bool,
    check_bootstrap,
    check_choice,
    check_float,
    check_hex,
    check_host_port,
    check_int,
    check_ip,
    check_multiaddr,
    check_optional,
    check_path,
    check_relay,
    check_socket_path,
    check_str,
    check_str_list,
    check_table,
    shown,
)
from peerd.daemon.config_checks import (
    ConfigError as ConfigError,  # raised here, caught by callers of peerd.daemon.config
)

# The sections kept in their own modules, re-exported: callers import them from here.
from peerd.daemon.config_learner import LearnerConfig as LearnerConfig
from peerd.daemon.config_learner import check_learner, read_learner
from peerd.daemon.config_learning import CordialConfig as CordialConfig
from peerd.daemon.config_learning import FedBSSConfig as FedBSSConfig
from peerd.daemon.config_learning import KnowledgeConfig as KnowledgeConfig
from peerd.daemon.config_learning import LearningConfig as LearningConfig
from peerd.daemon.config_learning import check_learning, read_learning, settle_mode, what_runs
from peerd.daemon.config_task import TASK_CHECKS, check_task
from peerd.daemon.config_task import TaskConfig as TaskConfig
from peerd.daemon.config_tracking import TrackingConfig as TrackingConfig
from peerd.daemon.config_tracking import read_tracking
from peerd.node.peers import DEFAULT_FANOUT, MAX_PEERS
from peerd.protocol.encoding import RAW, Encoding
from peerd.protocol.limits import FLEET_ID_LEN, PUBLIC_KEY_LEN

DEFAULT_CONFIG_PATH = Path("/etc/peerd/peerd.toml")
DEFAULT_STATE_DIR = Path("/var/lib/peerd")
DEFAULT_SOCKET = Path("/run/peerd/peerd.sock")
#: The control socket's name inside a state directory other than DEFAULT_STATE_DIR.
SOCKET_NAME = "peerd.sock"
#: Environment variable naming the state directory (as ``--state-dir`` does, for every command).
STATE_DIR_ENV = "PEERD_STATE_DIR"
#: The default libp2p port; several daemons on one machine each need their own (or 0).
DEFAULT_LISTEN_PORT = 4011



# ---------------------------------------------------------------------------- sections


@dataclass(frozen=True, slots=True)
class NodeConfig:
    #: Identity key, cache entries, counters, audit log (created 0700).
    state_dir: Path = DEFAULT_STATE_DIR
    #: Control socket (``peerd status``); None: :func:`default_socket` of the state directory,
    #: so two daemons with different state directories never share one.
    socket: Path | None = None
    #: When set, the socket is 0660 and owned by this group (instead of 0600, owner only).
    socket_group: str | None = None
    #: torch intra-op threads for training: the device has other work to do.
    torch_threads: int = 1
    #: Return large freed buffers to the OS at once (see peerd.daemon.memory): less peak memory,
    #: slower training steps; a daemon trains for a small part of each round interval.
    lean_memory: bool = True
    log_level: str = "info"

    @property
    def control_socket(self) -> Path:
        """The control socket in force: ``socket`` if set, else :func:`default_socket`."""
        return self.socket if self.socket is not None else default_socket(self.state_dir)


def default_socket(state_dir: Path) -> Path:
    """``/run/peerd/peerd.sock`` for the system state directory ``/var/lib/peerd``, else
    ``<state_dir>/peerd.sock``: a second daemon (another state directory) never collides."""
    if Path(state_dir).absolute() == DEFAULT_STATE_DIR:
        return DEFAULT_SOCKET
    return Path(state_dir) / SOCKET_NAME


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    listen_host: str = "0.0.0.0"  # noqa: S104 -- a LAN daemon listens on the LAN by design
    #: 0 picks a free port (advertised over mDNS), handy for several daemons on one host.
    listen_port: int = DEFAULT_LISTEN_PORT
    mdns: bool = True
    #: Interface names to advertise/browse on; empty = all.
    mdns_interfaces: tuple[str, ...] = ()
    #: Multiaddrs dialled at start-up and retried: the fallback where multicast is blocked.
    static_peers: tuple[str, ...] = ()
    #: Multiaddrs (IP or DNS names, ending in /p2p/<id>) of members dialled at start and
    #: whenever no peer is in reach; the rest of the fleet is learned from them (signed
    #: address records handed on in sessions, kept in the state directory's address book).
    bootstrap: tuple[str, ...] = ()
    #: Circuit Relay v2 relays (``/ip4|ip6|dns4|dns6|dns/HOST/tcp/PORT/p2p/ID``, members or
    #: not; a name is resolved when dialled) this node
    #: reserves a slot on, so that members behind other NATs can dial it through them; its
    #: circuit addresses go in its address record and the relays' rendezvous point, where it
    #: also finds the other members' (peerd.net.relayclient).
    relays: tuple[str, ...] = ()
    #: Also reserve on up to peerd.node.relaylearn.MAX_LEARNED_RELAYS members whose signed
    #: address record says they run ``relay_service`` (learned by address exchange), beside
    #: ``relays``; false: the configured relays only (and no relay client without them).
    learn_relays: bool = True
    #: ``HOST:PORT`` of the Prometheus endpoint; None = no endpoint.
    metrics_listen: str | None = None
    #: Bytes/s each peer may send us (and we it), sustained; bursts up to one full session.
    #: None = automatic: twice what an honest peer can need, i.e. all C + 1 entries of the
    #: largest allowed size once per round interval. See docs/operations.md.
    peer_bytes_per_s: int | None = None
    #: Entries received at once, from all peers together; each is spooled to a model-sized
    #: temporary file until verified (peerd.store.spool). Receiving is CPU-bound (Noise runs in
    #: Python under the GIL), so a second slot buys little speed.
    max_concurrent_receives: int = 1
    #: Sessions this node starts per gossip sweep (~3 s), with the peers it synchronised with
    #: longest ago: a node's cost per sweep stays constant as the fleet grows (see
    #: ``peerd.node.peers.DEFAULT_FANOUT``). Peers also dial us, so it syncs more often.
    fanout: int = DEFAULT_FANOUT
    #: Sessions peers opened with us that run at once; more are refused (the stream closed:
    #: the dialler backs off for seconds and syncs with someone else meanwhile).
    max_inbound_sessions: int = 8
    #: Connections to known peers kept open; beyond it the least recently synchronised idle
    #: ones are closed after a session (a bounded sweep meets new peers over time, and
    #: py-libp2p would otherwise keep a connection to every peer it ever met).
    max_connections: int = 16
    #: Also run a Circuit Relay v2 hop and a rendezvous point on this node's host
    #: (peerd.net.relay, what `peerd relay` runs alone): a reachable member offers NAT'd
    #: members slots and a directory. Its limits are peerd.net.relay.RELAY_LIMITS.
    relay_service: bool = False
    #: Upgrade a member reached through a relay to a direct connection by DCUtR hole
    #: punching (peerd.net.dcutr): works between endpoint-independent NATs; needs a relay,
    #: configured (``relays``) or learned (``learn_relays``).
    hole_punch: bool = False


@dataclass(frozen=True, slots=True)
class FleetConfig:
    admin_public_key: bytes
    fleet_id: bytes
    #: Initial signed manifest (``manifest.peerd``); None = learn it from peers (it spreads).
    manifest: Path | None = None
    #: How this node's weight entries carry float32 tensors (peerd.protocol.encoding):
    #: float32 (raw), float16, bfloat16, int8 or int8:B. Set fleet-wide by convention (the
    #: bytes each entry costs every link); every node accepts every encoding.
    entry_encoding: Encoding = RAW


def check_encoding(v: Any) -> Encoding:
    if not isinstance(v, str):
        raise BadValueError(f"must be a string, got {shown(v)}")
    try:
        return Encoding.parse(v)
    except ValueError as exc:
        raise BadValueError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class ValidationConfig:
    max_norm: float = 1e4
    max_examples: int = 10_000_000
    max_future_skew_s: float = 300.0
    #: Update-norm validation (peerd.core.updatenorm): ‖entry − own model‖ against
    #: ``update_norm_multiple`` × the median of the last ``update_norm_window`` update norms
    #: seen (no bound before ``update_norm_min_history`` of them). "off" | "reject" | "clip".
    update_norm: str = "off"
    update_norm_multiple: float = 4.0
    update_norm_window: int = 64
    update_norm_min_history: int = 8

    @property
    def update_norm_policy(self) -> UpdateNormPolicy:
        return UpdateNormPolicy(NormAction(self.update_norm), self.update_norm_multiple,
                                self.update_norm_window, self.update_norm_min_history)

    def limits(self) -> ValidationLimits:
        return ValidationLimits(max_norm=self.max_norm, max_examples=self.max_examples,
                                max_future_skew_s=self.max_future_skew_s)


@dataclass(frozen=True, slots=True)
class Config:
    fleet: FleetConfig
    node: NodeConfig = field(default_factory=NodeConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    learning: LearningConfig = field(default_factory=LearningConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    #: Who trains weight mode's local step (builtin, or the user's code in a worker).
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    #: Where each round's metrics are written besides the round log (MLflow, TensorBoard).
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    #: The file it came from (None when built in code).
    source: Path | None = None
    #: One line per deprecated spelling the file used, naming the new one (``peerd run``
    #: logs them at start-up); not part of the settings, so not compared.
    deprecations: tuple[str, ...] = field(default=(), compare=False)

    def status_config(self) -> ConfigStatus:
        """The ``config`` section of the status (the only place that builds it)."""
        lc = self.learning
        mode, blend, local_policy = what_runs(lc)
        return ConfigStatus(tau_max=lc.tau_max, staleness=lc.staleness, capacity=lc.capacity,
                            rho=lc.rho, local_steps=lc.local_steps, alpha=lc.alpha,
                            epsilon=lc.epsilon, max_silence_s=lc.silence_limit_s,
                            round_interval_s=lc.round_interval_s, task=self.task.name,
                            mode=mode.value, blend=blend, local_policy=local_policy,
                            learner=self.learner.kind,
                            encoding=str(self.fleet.entry_encoding))

    @classmethod
    def default(cls, admin_public_key: bytes, fleet_id: bytes, *,
                manifest: Path | None = None, state_dir: Path | None = None,
                socket: Path | None = None) -> Config:
        """Defaults everywhere but the fleet (and optionally the paths)."""
        return loads_config({
            "fleet": {"admin_public_key": admin_public_key.hex(), "fleet_id": fleet_id.hex(),
                      **({} if manifest is None else {"manifest": str(manifest)})},
            "node": {k: str(v) for k, v in (("state_dir", state_dir), ("socket", socket))
                     if v is not None},
        })


_SCHEMA: dict[str, tuple[type[Any], dict[str, Check]]] = {
    "node": (NodeConfig, {
        "state_dir": check_path, "socket": check_optional(check_socket_path),
        "socket_group": check_optional(check_str),
        "torch_threads": check_int(1, lim.MAX_TORCH_THREADS), "lean_memory": check_bool,
        "log_level": check_choice(*lim.LOG_LEVELS),
    }),
    "network": (NetworkConfig, {
        "listen_host": check_ip, "listen_port": check_int(0, 65535), "mdns": check_bool,
        "mdns_interfaces": check_str_list(lim.MAX_MDNS_INTERFACES),
        "static_peers": check_str_list(lim.MAX_STATIC_PEERS, check_multiaddr),
        "bootstrap": check_str_list(lim.MAX_BOOTSTRAP_PEERS, check_bootstrap),
        "relays": check_str_list(lim.MAX_RELAYS, check_relay),
        "metrics_listen": check_optional(check_host_port),
        "peer_bytes_per_s": check_optional(check_int(1)),
        "max_concurrent_receives": check_int(1, lim.MAX_CONCURRENT_RECEIVES),
        "fanout": check_int(1, lim.MAX_FANOUT),
        "max_inbound_sessions": check_int(1, lim.MAX_INBOUND_SESSIONS),
        "max_connections": check_int(1, MAX_PEERS),
        "relay_service": check_bool, "hole_punch": check_bool, "learn_relays": check_bool,
    }),
    "fleet": (FleetConfig, {
        "admin_public_key": check_hex(PUBLIC_KEY_LEN), "fleet_id": check_hex(FLEET_ID_LEN),
        "manifest": check_optional(check_path),
        "entry_encoding": check_encoding,
    }),
    "validation": (ValidationConfig, {
        "max_norm": check_float(0.0, strict=True), "max_examples": check_int(1),
        "max_future_skew_s": check_float(0.0),
        "update_norm": check_choice("off", "reject", "clip"),
        "update_norm_multiple": check_float(0.0, strict=True),
        "update_norm_window": check_int(1, lim.MAX_UPDATE_NORM_WINDOW),
        "update_norm_min_history": check_int(1, lim.MAX_UPDATE_NORM_WINDOW),
    }),
    "task": (TaskConfig, TASK_CHECKS),
}
_REQUIRED = {"fleet": ("admin_public_key", "fleet_id")}

# A schema entry per dataclass field and vice versa: a new field without a check (or a check
# for a field that does not exist) would be a silent hole in the validation.
for _name, (_cls, _checks) in _SCHEMA.items():
    assert {f.name for f in fields(_cls)} == set(_checks), _name


# ---------------------------------------------------------------------------- loading

#: Every section, in the order the known ones are listed ([learning]: config_learning,
#: [learner]: config_learner, [tracking]: config_tracking).
SECTIONS = ("node", "network", "fleet", "learning", "validation", "task", "learner",
            "tracking")


def _section(name: str, raw: Any, base: Path | None) -> Any:
    cls, checks = _SCHEMA[name]
    return cls(**check_table(f"[{name}]", raw, checks, required=_REQUIRED.get(name, ()),
                             base=base))


def loads_config(data: Mapping[str, Any], *, source: Path | None = None) -> Config:
    """Validate an already-parsed TOML document (a dict) into a :class:`Config`."""
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"[{unknown[0]}]: unknown section (known: {', '.join(SECTIONS)})")
    if "fleet" not in data:
        raise ConfigError("[fleet]: required section (admin_public_key, fleet_id); "
                          "`peerd init --fleet DIR` writes it")
    base = None if source is None else source.parent
    parts = {name: _section(name, data[name], base) for name in _SCHEMA if name in data}
    learning, notices = (read_learning(data["learning"]) if "learning" in data
                         else (LearningConfig(), []))
    task: TaskConfig = parts.pop("task", TaskConfig())
    check_task(task)
    raw_task = data.get("task")
    learning, task, settled = settle_mode(
        learning, task, task_named=isinstance(raw_task, Mapping) and "name" in raw_task)
    validation: ValidationConfig | None = parts.get("validation")
    if validation is not None and \
            validation.update_norm_min_history > validation.update_norm_window:
        raise ConfigError("[validation] update_norm_min_history: must be <= update_norm_window "
                          f"({validation.update_norm_window}), got "
                          f"{validation.update_norm_min_history}")
    check_learning(learning, task)
    network: NetworkConfig | None = parts.get("network")
    if network is not None and network.hole_punch and not network.relays \
            and not network.learn_relays:
        raise ConfigError("[network] hole_punch: needs [network] relays or learn_relays = "
                          "true (DCUtR upgrades connections made through a relay, and only "
                          "a relay client accepts them)")
    fleet: FleetConfig = parts["fleet"]
    if not fleet.entry_encoding.lossless and learning.mode is not ModeName.WEIGHTS:
        raise ConfigError(f"[fleet] entry_encoding: {fleet.entry_encoding} applies to weight "
                          f"entries; [learning] mode = \"{learning.mode.value}\" publishes "
                          "its own kinds (leave it float32)")
    learner = read_learner(data["learner"]) if "learner" in data else LearnerConfig()
    check_learner(learner, mode=learning.mode, local_policy=learning.local_policy,
                  task_given="task" in data)
    tracking = read_tracking(data["tracking"], base) if "tracking" in data \
        else TrackingConfig()
    return Config(**parts, learning=learning, task=task, learner=learner, tracking=tracking,
                  source=source, deprecations=(*settled, *notices))


def load_config(path: Path) -> Config:
    """Read and validate ``path``; any problem is a :class:`ConfigError` naming the file."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(lim.MAX_CONFIG_FILE_LEN + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    if len(raw) > lim.MAX_CONFIG_FILE_LEN:
        raise ConfigError(f"config {path} is larger than {lim.MAX_CONFIG_FILE_LEN} bytes")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from None
    try:
        return loads_config(data, source=path.resolve())
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def mode_of(cfg: Config) -> ModeName:
    """The learning mode ``cfg`` runs (``[learning] mode``; the old sensors form is settled
    into it when the config is read)."""
    return cfg.learning.mode
