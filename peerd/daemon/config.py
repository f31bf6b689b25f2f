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

import ipaddress
import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from peerd.control.status import ConfigStatus
from peerd.core.alpha import AlphaError, AlphaPolicy

# peerd.core.limits, not peerd.core.validate (torch): `peerd status` loads this module.
from peerd.core.limits import ValidationLimits
from peerd.protocol.limits import FLEET_ID_LEN, PUBLIC_KEY_LEN

DEFAULT_CONFIG_PATH = Path("/etc/peerd/peerd.toml")
DEFAULT_STATE_DIR = Path("/var/lib/peerd")
DEFAULT_SOCKET = Path("/run/peerd/peerd.sock")
#: The default libp2p port; several daemons on one machine each need their own (or 0).
DEFAULT_LISTEN_PORT = 4011

#: Largest config file read: a real one is a few KB; refuse to parse a runaway file.
MAX_CONFIG_FILE_LEN = 1 << 20
#: Bound on static peers: each is dialled and retried, so the list is a cost, not free data.
MAX_STATIC_PEERS = 256
#: AF_UNIX socket paths are limited to 108 bytes (sun_path) on Linux, NUL included.
MAX_SOCKET_PATH_LEN = 107
#: Bound on mDNS interface names: a host has a handful; a long list is a mistake.
MAX_MDNS_INTERFACES = 64
#: Bound on CSV feature column names (wide tables exist; a million names is a mistake).
MAX_CSV_FEATURES = 100_000
#: Bound on a torch thread count: more than the cores only adds contention.
MAX_TORCH_THREADS = 1024
#: Bound on concurrent entry receptions: each writes one model-sized temporary file.
MAX_CONCURRENT_RECEIVES = 64

LOG_LEVELS = ("debug", "info", "warning", "error")
TASKS = ("digits", "mnist", "fashion-mnist", "csv")
_CUSTOM_TASK = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_PARTITION = re.compile(r"^(iid|shards|dirichlet:.+)$")


class ConfigError(ValueError):
    """A config file that cannot be read or holds an unknown key or a bad value."""


# ---------------------------------------------------------------------------- sections


@dataclass(frozen=True, slots=True)
class NodeConfig:
    #: Identity key, cache entries, counters, audit log (created 0700).
    state_dir: Path = DEFAULT_STATE_DIR
    #: Control socket (``peerd status``); a setting so several daemons can share a machine.
    socket: Path = DEFAULT_SOCKET
    #: When set, the socket is 0660 and owned by this group (instead of 0600, owner only).
    socket_group: str | None = None
    #: torch intra-op threads for training: the device has other work to do.
    torch_threads: int = 1
    #: Return large freed buffers to the OS at once (see peerd.daemon.memory): less peak memory,
    #: slower training steps; a daemon trains for a small part of each round interval.
    lean_memory: bool = True
    log_level: str = "info"


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
    #: Only "time": "rounds" is refused (see _staleness); the simulator keeps round ages.
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
        return ConfigStatus(tau_max=lc.tau_max, staleness=lc.staleness, capacity=lc.capacity,
                            rho=lc.rho, local_steps=lc.local_steps, alpha=lc.alpha,
                            epsilon=lc.epsilon, round_interval_s=lc.round_interval_s,
                            task=self.task.name)

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


# ---------------------------------------------------------------------------- value checks

Check = Callable[[Any], Any]


class _BadError(Exception):
    """A value check failed; the message says what was expected (the key is added later)."""


def _got(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)


def _int(lo: int, hi: int | None = None) -> Check:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise _BadError(f"must be an integer {rng}, got {_got(v)}")
        return v
    return check


def _float(lo: float, *, strict: bool = False) -> Check:
    def check(v: Any) -> float:
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or (v <= lo if strict else v < lo):
            op = ">" if strict else ">="
            raise _BadError(f"must be a finite number {op} {lo:g}, got {_got(v)}")
        return float(v)
    return check


def _str(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise _BadError(f"must be a non-empty string, got {_got(v)}")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _BadError(f"must be true or false, got {_got(v)}")
    return v


def _choice(*options: str) -> Check:
    def check(v: Any) -> str:
        if v not in options:
            raise _BadError(f"must be one of {', '.join(options)}, got {_got(v)}")
        return str(v)
    return check


def _path(v: Any) -> Path:
    if not isinstance(v, str) or not v or "\0" in v:
        raise _BadError(f"must be a non-empty path string, got {_got(v)}")
    return Path(v).expanduser()


def _socket_path(v: Any) -> Path:
    p = _path(v)
    if len(str(p).encode()) > MAX_SOCKET_PATH_LEN:
        raise _BadError(f"a Unix socket path holds at most {MAX_SOCKET_PATH_LEN} bytes, got {p}")
    return p


def _hex(length: int) -> Check:
    def check(v: Any) -> bytes:
        try:
            raw = bytes.fromhex(v) if isinstance(v, str) else None
        except ValueError:
            raw = None
        if raw is None or len(raw) != length:
            raise _BadError(f"must be {length} bytes as {2 * length} hex digits, got {_got(v)}")
        return raw
    return check


def _str_list(limit: int, item: Check = _str) -> Check:
    def check(v: Any) -> tuple[Any, ...]:
        if not isinstance(v, list) or len(v) > limit:
            raise _BadError(f"must be a list of at most {limit} strings, got {_got(v)}")
        try:
            return tuple(item(x) for x in v)
        except _BadError as exc:
            raise _BadError(f"list item: {exc}") from None
    return check


def _multiaddr(v: Any) -> str:
    # Full parsing is the transport's job (py-libp2p); here catch the obvious mistakes early.
    if not isinstance(v, str) or not v.startswith("/") or "/p2p/" not in v:
        raise _BadError("must be a multiaddr like /ip4/10.0.0.2/tcp/4011/p2p/12D3KooW..., "
                             f"got {_got(v)}")
    return v


def _host_port(v: Any) -> str:
    if isinstance(v, str) and ":" in v:
        host, _, port = v.rpartition(":")
        host = host.strip("[]")
        try:
            ipaddress.ip_address(host)
            if 0 < int(port) < 65536:
                return v
        except ValueError:
            pass
    raise _BadError(f"must be IP:PORT (e.g. 127.0.0.1:9464), got {_got(v)}")


def _ip(v: Any) -> str:
    try:
        return str(ipaddress.ip_address(v))
    except ValueError:
        raise _BadError(f"must be an IP address, got {_got(v)}") from None


def _staleness(v: Any) -> str:
    if v == "rounds":
        # An age in rounds subtracts an origin's *version* from this node's *round*: nodes
        # share no round counter, and version != round once epsilon skips a publish, so a
        # newcomer's entries look ancient (never fetched) and an old node's look negative
        # (never age out, full alpha). Only the simulator, where version = round, keeps it.
        raise _BadError('"rounds" is not supported by the daemon: nodes share no round '
                        "counter (an entry's version is not a round once epsilon skips a "
                        'publish), so round ages are meaningless across nodes; use "time" '
                        "with tau_max in seconds")
    return str(_choice("time")(v))


def _alpha(v: Any) -> str:
    spec = _str(v)
    try:
        AlphaPolicy.parse(spec)
    except AlphaError as exc:
        raise _BadError(f"bad alpha policy: {exc}") from None
    return spec


def _task_name(v: Any) -> str:
    if v in TASKS or (isinstance(v, str) and _CUSTOM_TASK.match(v)):
        return str(v)
    raise _BadError(f"must be one of {', '.join(TASKS)} or package.module:attr, got {_got(v)}")


def _partition(v: Any) -> str:
    if isinstance(v, str) and _PARTITION.match(v):
        if v.startswith("dirichlet:"):
            try:
                pi = float(v.split(":", 1)[1])
            except ValueError:
                pi = math.nan
            if not (math.isfinite(pi) and pi > 0):
                raise _BadError(f"dirichlet concentration must be a positive number, got {v!r}")
        return v
    raise _BadError(f"must be iid, shards or dirichlet:PI, got {_got(v)}")


def _optional(check: Check) -> Check:
    # TOML has no null: an optional key is simply left out; an empty string also means unset.
    def opt(v: Any) -> Any:
        return None if v == "" else check(v)
    return opt


_SCHEMA: dict[str, tuple[type[Any], dict[str, Check]]] = {
    "node": (NodeConfig, {
        "state_dir": _path, "socket": _socket_path, "socket_group": _optional(_str),
        "torch_threads": _int(1, MAX_TORCH_THREADS), "lean_memory": _bool,
        "log_level": _choice(*LOG_LEVELS),
    }),
    "network": (NetworkConfig, {
        "listen_host": _ip, "listen_port": _int(0, 65535), "mdns": _bool,
        "mdns_interfaces": _str_list(MAX_MDNS_INTERFACES),
        "static_peers": _str_list(MAX_STATIC_PEERS, _multiaddr),
        "metrics_listen": _optional(_host_port),
        "peer_bytes_per_s": _optional(_int(1)),
        "max_concurrent_receives": _int(1, MAX_CONCURRENT_RECEIVES),
    }),
    "fleet": (FleetConfig, {
        "admin_public_key": _hex(PUBLIC_KEY_LEN), "fleet_id": _hex(FLEET_ID_LEN),
        "manifest": _optional(_path),
    }),
    "learning": (LearningConfig, {
        "tau_max": _float(0.0), "staleness": _staleness,
        "capacity": _int(0), "rho": _float(0.0), "local_steps": _int(1),
        "batch_size": _int(1), "lr": _float(0.0, strict=True), "alpha": _alpha,
        "epsilon": _float(0.0), "round_interval_s": _float(0.0),
        "max_silence_s": _optional(_float(0.0, strict=True)),
    }),
    "validation": (ValidationConfig, {
        "max_norm": _float(0.0, strict=True), "max_examples": _int(1),
        "max_future_skew_s": _float(0.0),
    }),
    "task": (TaskConfig, {
        "name": _task_name, "partition": _partition, "node_index": _int(0),
        "node_count": _int(1), "seed": _int(0), "csv_glob": _optional(_str),
        "csv_label": _str, "csv_features": _str_list(MAX_CSV_FEATURES),
        "csv_kind": _choice("classification", "regression"),
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
        raise ConfigError(f"[{name}] must be a table, got {_got(raw)}")
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
        except _BadError as exc:
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
    return Config(**parts, source=source)


def load_config(path: Path) -> Config:
    """Read and validate ``path``; any problem is a :class:`ConfigError` naming the file."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_FILE_LEN + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    if len(raw) > MAX_CONFIG_FILE_LEN:
        raise ConfigError(f"config {path} is larger than {MAX_CONFIG_FILE_LEN} bytes")
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
