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
from typing import Any, Literal

from peerd.control.status import ConfigStatus
from peerd.core.alpha import AlphaPolicy
from peerd.core.blendrules import Krum, parse_rule

# peerd.core.limits, not peerd.core.validate (torch): `peerd status` loads this module.
from peerd.core.limits import ValidationLimits
from peerd.core.modes import ModeName
from peerd.core.updatenorm import NormAction, UpdateNormPolicy
from peerd.daemon import config_limits as lim
from peerd.daemon.config_checks import (
    BadValueError,
    Check,
    check_alpha,
    check_blend,
    check_bool,
    check_choice,
    check_float,
    check_group,
    check_hex,
    check_host_port,
    check_int,
    check_ip,
    check_model_name,
    check_multiaddr,
    check_optional,
    check_partition,
    check_path,
    check_socket_path,
    check_staleness,
    check_str,
    check_str_list,
    check_task_name,
    shown,
)
from peerd.daemon.config_checks import (
    ConfigError as ConfigError,  # raised here, caught by callers of peerd.daemon.config
)
from peerd.daemon.config_modes import check_mode, what_runs
from peerd.node.peers import DEFAULT_FANOUT, MAX_PEERS
from peerd.protocol.limits import (
    FLEET_ID_LEN,
    MAX_KEY_DIM,
    PUBLIC_KEY_LEN,
)

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


@dataclass(frozen=True, slots=True)
class FleetConfig:
    admin_public_key: bytes
    fleet_id: bytes
    #: Initial signed manifest (``manifest.peerd``); None = learn it from peers (it spreads).
    manifest: Path | None = None


@dataclass(frozen=True, slots=True)
class LearningConfig:
    #: Staleness cutoff τ_max, in seconds.
    tau_max: float = 600.0
    #: Only "time": "rounds" is refused (see check_staleness); the simulator keeps round ages.
    staleness: Literal["time"] = "time"
    capacity: int = 10  # C: peer entries kept in the cache
    rho: float = 0.01  # ρ: proximal weight towards the blend
    local_steps: int = 10  # K
    batch_size: int = 32
    lr: float = 0.05
    alpha: str = "uniform"  # see peerd.core.alpha for the spellings
    #: Publish the own entry only when its drift exceeds ε (saves bandwidth on a plateau).
    epsilon: float = 0.0
    round_interval_s: float = 10.0
    #: With ε > 0: re-sign and publish the current model after this many seconds without a
    #: publication, so peers never age the node's entry out past τ_max. None: τ_max / 2.
    max_silence_s: float | None = None
    #: "weights" (Cached-DFL: models are exchanged and blended) or "knowledge" (FedCache:
    #: per-sample logits are exchanged and distilled from; architectures may differ).
    mode: str = "weights"
    #: Knowledge mode: the sample key's width (all nodes of a fleet must agree).
    key_dim: int = 64
    #: Knowledge mode: β (weight of the KL term), temperature and R (neighbours averaged).
    distill_beta: float = 1.5
    distill_temperature: float = 3.0
    distill_r: int = 16
    #: Knowledge mode: samples kept in the cache over all peers (besides C entries).
    sample_capacity: int = 100_000
    #: How peer models are combined: "weighted" (Σ α_j x_j) or a robust rule, "median",
    #: "trimmed[:β]", "clipped[:τ]", "krum[:f]" (peerd.core.blendrules; weight mode only).
    blend: str = "weighted"
    #: How the node trains after the blend: "plain" (K proximal steps) or "fedbss" (warm-up
    #: rounds, then a loss-sorted curriculum; peerd.core.fedbss; weight mode, classification).
    local_policy: str = "plain"
    fedbss_warmup_rounds: int = 20
    fedbss_epochs: int = 10  # E: local epochs of one curriculum round
    fedbss_regrow: float = 0.2  # warm up again once the data grew by this fraction
    #: SGD steps of one curriculum round over the E epochs; 0 = E full epochs.
    fedbss_steps: int = 0
    #: This node's cache group (a data distribution, an area: "site-3"), signed into every
    #: entry it publishes; None: its entries name none. See peerd.protocol.entry.group_problem.
    group: str | None = None
    #: The most cache places the entries of one group may hold (peerd.core.cache: each
    #: group's freshest first, entries without a group fill the rest); None: the C freshest.
    capacity_per_group: int | None = None
    #: Cordial mode (Pairwise-10; [task] node_index is the agent, node_count the agents, seed
    #: the shared index's): P images per digit, whether the agent uses its peers' views
    #: (false: the isolated baseline, views still published), and the epochs its
    #: coordination layers stay frozen (the paper's K).
    cordial_images_per_digit: int = 25
    cordial_coordination: bool = True
    cordial_warmup_epochs: int = 50
    #: Cordial mode's sensors (peerd.core.timebuckets): a time bucket's seconds and the last
    #: buckets kept, trained on and published. Fleet-wide (part of the view schema).
    cordial_bucket_s: float = 10.0
    cordial_window: int = 64

    @property
    def alpha_policy(self) -> AlphaPolicy:
        return AlphaPolicy.parse(self.alpha)

    @property
    def silence_limit_s(self) -> float:
        """``max_silence_s`` in force: half of τ_max unless set, so a republished entry has
        the other half of τ_max (rounds and gossip sweeps) to reach peers before the last
        one expires there."""
        return self.tau_max / 2 if self.max_silence_s is None else self.max_silence_s


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
class TaskConfig:
    #: digits | mnist | fashion-mnist | csv | package.module:attr
    name: str = "digits"
    #: Demo tasks: iid | shards | dirichlet:PI, and this node's slice of node_count.
    partition: str = "dirichlet:0.5"
    node_index: int = 0
    node_count: int = 1
    seed: int = 0
    csv_glob: str | None = None
    csv_label: str = "label"
    #: Feature columns; empty = every column but the label.
    csv_features: tuple[str, ...] = ()
    csv_kind: Literal["classification", "regression"] = "classification"
    #: small | medium | large | cnn | mlp | linear | package.module:attr; None: the task's
    #: default. Knowledge mode lets every node pick its own; weight mode needs one fleet-wide.
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Config:
    fleet: FleetConfig
    node: NodeConfig = field(default_factory=NodeConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    learning: LearningConfig = field(default_factory=LearningConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    #: The file it came from (None when built in code).
    source: Path | None = None

    def status_config(self) -> ConfigStatus:
        """The ``config`` section of the status (the only place that builds it)."""
        lc = self.learning
        mode, blend, local_policy = what_runs(lc, self.task)
        return ConfigStatus(tau_max=lc.tau_max, staleness=lc.staleness, capacity=lc.capacity,
                            rho=lc.rho, local_steps=lc.local_steps, alpha=lc.alpha,
                            epsilon=lc.epsilon, max_silence_s=lc.silence_limit_s,
                            round_interval_s=lc.round_interval_s, task=self.task.name,
                            mode=mode.value, blend=blend, local_policy=local_policy)

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
        "metrics_listen": check_optional(check_host_port),
        "peer_bytes_per_s": check_optional(check_int(1)),
        "max_concurrent_receives": check_int(1, lim.MAX_CONCURRENT_RECEIVES),
        "fanout": check_int(1, lim.MAX_FANOUT),
        "max_inbound_sessions": check_int(1, lim.MAX_INBOUND_SESSIONS),
        "max_connections": check_int(1, MAX_PEERS),
    }),
    "fleet": (FleetConfig, {
        "admin_public_key": check_hex(PUBLIC_KEY_LEN), "fleet_id": check_hex(FLEET_ID_LEN),
        "manifest": check_optional(check_path),
    }),
    "learning": (LearningConfig, {
        "tau_max": check_float(0.0), "staleness": check_staleness,
        "capacity": check_int(0, lim.MAX_CAPACITY), "rho": check_float(0.0),
        "local_steps": check_int(1),
        "batch_size": check_int(1), "lr": check_float(0.0, strict=True), "alpha": check_alpha,
        "epsilon": check_float(0.0), "round_interval_s": check_float(lim.MIN_ROUND_INTERVAL_S),
        "max_silence_s": check_optional(check_float(0.0, strict=True)),
        "mode": check_choice(*lim.LEARNING_MODES), "key_dim": check_int(1, MAX_KEY_DIM),
        "distill_beta": check_float(0.0), "distill_temperature": check_float(0.0, strict=True),
        "distill_r": check_int(1), "sample_capacity": check_int(1), "blend": check_blend,
        "local_policy": check_choice("plain", "fedbss"), "fedbss_warmup_rounds": check_int(0),
        "fedbss_epochs": check_int(1, lim.MAX_FEDBSS_EPOCHS), "fedbss_regrow": check_float(0.0),
        "fedbss_steps": check_int(0, lim.MAX_FEDBSS_STEPS),
        "group": check_optional(check_group),
        "capacity_per_group": check_optional(check_int(1, lim.MAX_CAPACITY)),
        "cordial_images_per_digit": check_int(1, lim.MAX_CORDIAL_IMAGES_PER_DIGIT),
        "cordial_coordination": check_bool, "cordial_warmup_epochs": check_int(0),
        "cordial_bucket_s": check_float(0.0, strict=True),
        "cordial_window": check_int(lim.MIN_CORDIAL_WINDOW, lim.MAX_CORDIAL_WINDOW),
    }),
    "validation": (ValidationConfig, {
        "max_norm": check_float(0.0, strict=True), "max_examples": check_int(1),
        "max_future_skew_s": check_float(0.0),
        "update_norm": check_choice("off", "reject", "clip"),
        "update_norm_multiple": check_float(0.0, strict=True),
        "update_norm_window": check_int(1, lim.MAX_UPDATE_NORM_WINDOW),
        "update_norm_min_history": check_int(1, lim.MAX_UPDATE_NORM_WINDOW),
    }),
    "task": (TaskConfig, {
        "name": check_task_name, "partition": check_partition, "node_index": check_int(0),
        "node_count": check_int(1), "seed": check_int(0), "csv_glob": check_optional(check_str),
        "csv_label": check_str, "csv_features": check_str_list(lim.MAX_CSV_FEATURES),
        "csv_kind": check_choice("classification", "regression"),
        "model": check_optional(check_model_name),
    }),
}
_REQUIRED = {"fleet": ("admin_public_key", "fleet_id")}

# A schema entry per dataclass field and vice versa: a new field without a check (or a check
# for a field that does not exist) would be a silent hole in the validation.
for _name, (_cls, _checks) in _SCHEMA.items():
    assert {f.name for f in fields(_cls)} == set(_checks), _name


# ---------------------------------------------------------------------------- loading


def _section(name: str, raw: Any, base: Path | None) -> Any:
    cls, checks = _SCHEMA[name]
    if not isinstance(raw, Mapping):
        raise ConfigError(f"[{name}] must be a table, got {shown(raw)}")
    unknown = sorted(set(raw) - set(checks))
    if unknown:
        raise ConfigError(f"[{name}] {unknown[0]}: unknown key "
                          f"(known: {', '.join(sorted(checks))})")
    for key in _REQUIRED.get(name, ()):
        if key not in raw:
            raise ConfigError(f"[{name}] {key}: required (see `peerd init --fleet DIR`)")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            values[key] = checks[key](value)
        except BadValueError as exc:
            raise ConfigError(f"[{name}] {key}: {exc}") from None
        if isinstance(values[key], Path) and base is not None:
            # Relative paths are relative to the config file, not to the daemon's cwd
            # (systemd starts it in /), so a config that works by hand works as a service.
            values[key] = base / values[key]
    return cls(**values)


def loads_config(data: Mapping[str, Any], *, source: Path | None = None) -> Config:
    """Validate an already-parsed TOML document (a dict) into a :class:`Config`."""
    unknown = sorted(set(data) - set(_SCHEMA))
    if unknown:
        raise ConfigError(f"[{unknown[0]}]: unknown section (known: {', '.join(_SCHEMA)})")
    if "fleet" not in data:
        raise ConfigError("[fleet]: required section (admin_public_key, fleet_id); "
                          "`peerd init --fleet DIR` writes it")
    base = None if source is None else source.parent
    parts = {name: _section(name, data[name], base) for name in _SCHEMA if name in data}
    learning: LearningConfig | None = parts.get("learning")
    if learning is not None and learning.max_silence_s is not None \
            and learning.max_silence_s >= learning.tau_max:
        # A silence of tau_max lets the last entry expire at every peer before the next one
        # is even made: the node drops out of the fleet's blends in between.
        raise ConfigError(f"[learning] max_silence_s: must be < tau_max ({learning.tau_max:g})"
                          f", got {learning.max_silence_s:g}")
    task: TaskConfig | None = parts.get("task")
    if task is not None:
        if task.node_index >= task.node_count:
            raise ConfigError(f"[task] node_index: must be < node_count ({task.node_count}), "
                              f"got {task.node_index}")
        if task.name == "csv" and task.csv_glob is None:
            raise ConfigError("[task] csv_glob: required when name = \"csv\"")
        if task.name == "sensors" and (learning is None or learning.mode != "cordial"):
            raise ConfigError('[task] name: "sensors" runs in [learning] mode = "cordial" only '
                              "(its labels depend on the other nodes' inputs)")
    validation: ValidationConfig | None = parts.get("validation")
    if validation is not None and \
            validation.update_norm_min_history > validation.update_norm_window:
        raise ConfigError("[validation] update_norm_min_history: must be <= update_norm_window "
                          f"({validation.update_norm_window}), got "
                          f"{validation.update_norm_min_history}")
    if learning is not None and learning.capacity_per_group is not None \
            and learning.capacity_per_group > learning.capacity:
        raise ConfigError(f"[learning] capacity_per_group: must be <= capacity "
                          f"({learning.capacity}), got {learning.capacity_per_group}")
    if learning is not None and learning.blend.startswith("krum"):
        f = parse_rule(learning.blend)
        assert isinstance(f, Krum)
        if learning.capacity + 1 <= 2 * f.f + 2:
            raise ConfigError(f"[learning] blend: {learning.blend} needs more than 2f + 2 = "
                              f"{2 * f.f + 2} models, but capacity {learning.capacity} + the own "
                              "model can never hold that many")
    if learning is not None:
        check_mode(learning, task)
    return Config(**parts, source=source)


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
    """The learning mode ``cfg`` runs (:func:`peerd.daemon.config_modes.what_runs`)."""
    return what_runs(cfg.learning, cfg.task)[0]
