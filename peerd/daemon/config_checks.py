"""The value checks of the configuration: one small function per kind of value.

Each check takes the raw TOML value and returns the parsed one, or raises :class:`BadValueError`
saying what was expected; :mod:`peerd.daemon.config` adds the section and key to the message.
Split out of ``config.py`` to keep that module about the settings themselves. Like it, this
module must not import torch, libp2p or trio (``peerd status`` loads it).
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from peerd.core.alpha import AlphaError, AlphaPolicy
from peerd.core.blendrules import parse_rule
from peerd.core.modes import ModeName
from peerd.protocol.entry import group_problem
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import as_node_id
from peerd.protocol.peerrecord import check_multiaddr as check_dialable

#: AF_UNIX socket paths are limited to 108 bytes (sun_path) on Linux, NUL included.
MAX_SOCKET_PATH_LEN = 107
TASKS = ("digits", "mnist", "fashion-mnist", "csv", "sensors")
MODEL_NAMES = ("small", "medium", "large", "cnn", "mlp", "linear")
_CUSTOM_TASK = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_PARTITION = re.compile(r"^(iid|shards|dirichlet:.+)$")


Check = Callable[[Any], Any]


class ConfigError(ValueError):
    """A config file that cannot be read or holds an unknown key or a bad value."""


class BadValueError(Exception):
    """A value check failed; the message says what was expected (the key is added later)."""


def shown(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)


def check_int(lo: int, hi: int | None = None) -> Check:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise BadValueError(f"must be an integer {rng}, got {shown(v)}")
        return v
    return check


def check_float(lo: float, *, strict: bool = False) -> Check:
    def check(v: Any) -> float:
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or (v <= lo if strict else v < lo):
            op = ">" if strict else ">="
            raise BadValueError(f"must be a finite number {op} {lo:g}, got {shown(v)}")
        return float(v)
    return check


def check_str(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise BadValueError(f"must be a non-empty string, got {shown(v)}")
    return v


def check_bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise BadValueError(f"must be true or false, got {shown(v)}")
    return v


def check_choice(*options: str) -> Check:
    def check(v: Any) -> str:
        if v not in options:
            raise BadValueError(f"must be one of {', '.join(options)}, got {shown(v)}")
        return str(v)
    return check


def check_mode_name(v: Any) -> ModeName:
    if isinstance(v, str) and v in {m.value for m in ModeName}:
        return ModeName(v)
    raise BadValueError(f"must be one of {', '.join(ModeName)}, got {shown(v)}")


def check_path(v: Any) -> Path:
    if not isinstance(v, str) or not v or "\0" in v:
        raise BadValueError(f"must be a non-empty path string, got {shown(v)}")
    return Path(v).expanduser()


def check_socket_path(v: Any) -> Path:
    p = check_path(v)
    if len(str(p).encode()) > MAX_SOCKET_PATH_LEN:
        raise BadValueError(
            f"a Unix socket path holds at most {MAX_SOCKET_PATH_LEN} bytes, got {p}")
    return p


def check_hex(length: int) -> Check:
    def check(v: Any) -> bytes:
        try:
            raw = bytes.fromhex(v) if isinstance(v, str) else None
        except ValueError:
            raw = None
        if raw is None or len(raw) != length:
            raise BadValueError(
                f"must be {length} bytes as {2 * length} hex digits, got {shown(v)}")
        return raw
    return check


def check_str_list(limit: int, item: Check = check_str) -> Check:
    def check(v: Any) -> tuple[Any, ...]:
        if not isinstance(v, list) or len(v) > limit:
            raise BadValueError(f"must be a list of at most {limit} strings, got {shown(v)}")
        try:
            return tuple(item(x) for x in v)
        except BadValueError as exc:
            raise BadValueError(f"list item: {exc}") from None
    return check


def check_multiaddr(v: Any) -> str:
    # Full parsing is the transport's job (py-libp2p); here catch the obvious mistakes early.
    if not isinstance(v, str) or not v.startswith("/") or "/p2p/" not in v:
        raise BadValueError("must be a multiaddr like /ip4/10.0.0.2/tcp/4011/p2p/12D3KooW..., "
                             f"got {shown(v)}")
    return v


def _peer_addr(v: Any, example: str, what: str) -> str:
    """``/ip4|ip6|dns4|dns6|dns/HOST/tcp/PORT/p2p/ID``: the id is what the Noise handshake
    must prove; a name is resolved when the peer is dialled (peerd.net.bootstrap)."""
    if not isinstance(v, str):
        raise BadValueError(f"must be a {what}multiaddr like {example}, got {shown(v)}")
    head, _, peer_id = v.rpartition("/p2p/")
    try:
        check_dialable(head, f"{what}address")
        as_node_id(peer_id, f"{what}peer id")
    except ProtocolError as exc:
        raise BadValueError(f"{exc.message}: must be like {example}, got {shown(v)}") from None
    return v


def check_bootstrap(v: Any) -> str:
    """``[network] bootstrap``: a member's address (:func:`_peer_addr`)."""
    return _peer_addr(v, "/ip4/10.0.0.2/tcp/4011/p2p/12D3KooW... or "
                      "/dns4/host.example/tcp/4011/p2p/...", "")


def check_relay(v: Any) -> str:
    """``[network] relays``: a Circuit Relay v2 relay's address (:func:`_peer_addr`; a name
    is resolved each time the relay is dialled, bounded)."""
    return _peer_addr(v, "/ip4/203.0.113.7/tcp/4011/p2p/12D3KooW... or "
                      "/dns4/relay.example/tcp/4011/p2p/...", "relay ")


def check_host_port(v: Any) -> str:
    if isinstance(v, str) and ":" in v:
        host, _, port = v.rpartition(":")
        host = host.strip("[]")
        try:
            ipaddress.ip_address(host)
            if 0 < int(port) < 65536:
                return v
        except ValueError:
            pass
    raise BadValueError(f"must be IP:PORT (e.g. 127.0.0.1:9464), got {shown(v)}")


def check_ip(v: Any) -> str:
    try:
        return str(ipaddress.ip_address(v))
    except ValueError:
        raise BadValueError(f"must be an IP address, got {shown(v)}") from None


def check_staleness(v: Any) -> str:
    if v == "rounds":
        # An age in rounds subtracts an origin's *version* from this node's *round*: nodes
        # share no round counter, and version != round once epsilon skips a publish, so a
        # newcomer's entries look ancient (never fetched) and an old node's look negative
        # (never age out, full alpha). Only the simulator, where version = round, keeps it.
        raise BadValueError('"rounds" is not supported by the daemon: nodes share no round '
                        "counter (an entry's version is not a round once epsilon skips a "
                        'publish), so round ages are meaningless across nodes; use "time" '
                        "with tau_max in seconds")
    return str(check_choice("time")(v))


def check_alpha(v: Any) -> str:
    spec = check_str(v)
    try:
        AlphaPolicy.parse(spec)
    except AlphaError as exc:
        raise BadValueError(f"bad alpha policy: {exc}") from None
    return spec


def check_blend(v: Any) -> str:
    spec = check_str(v).strip()
    if spec == "weighted":
        return spec
    try:
        parse_rule(spec)
    except ValueError as exc:
        raise BadValueError(f"bad blend rule: {exc}") from None
    return spec


def check_group(v: Any) -> str:
    """A cache group label, as an entry's signed body may carry it (protocol/limits.py)."""
    problem = group_problem(v)
    if problem is not None:
        raise BadValueError(f"{problem}, got {shown(v)[:80]}")
    return str(v)


def check_task_name(v: Any) -> str:
    if v in TASKS or (isinstance(v, str) and _CUSTOM_TASK.match(v)):
        return str(v)
    raise BadValueError(f"must be one of {', '.join(TASKS)} or package.module:attr, got {shown(v)}")


def check_model_name(v: Any) -> str:
    if v in MODEL_NAMES or (isinstance(v, str) and _CUSTOM_TASK.match(v)):
        return str(v)
    raise BadValueError(f"must be one of {', '.join(MODEL_NAMES)} or package.module:attr, "
                    f"got {shown(v)}")


def check_partition(v: Any) -> str:
    if isinstance(v, str) and _PARTITION.match(v):
        if v.startswith("dirichlet:"):
            try:
                pi = float(v.split(":", 1)[1])
            except ValueError:
                pi = math.nan
            if not (math.isfinite(pi) and pi > 0):
                raise BadValueError(f"dirichlet concentration must be a positive number, got {v!r}")
        return v
    raise BadValueError(f"must be iid, shards or dirichlet:PI, got {shown(v)}")


def check_optional(check: Check) -> Check:
    # TOML has no null: an optional key is simply left out; an empty string also means unset.
    def opt(v: Any) -> Any:
        return None if v == "" else check(v)
    return opt


def check_value(label: str, check: Check, value: Any) -> Any:
    """``check(value)``, a failure a :class:`ConfigError` naming ``label`` (``[learning] lr``)."""
    try:
        return check(value)
    except BadValueError as exc:
        raise ConfigError(f"{label}: {exc}") from None


def check_table(section: str, raw: Any, checks: Mapping[str, Check], *,
                required: Collection[str] = (), base: Path | None = None) -> dict[str, Any]:
    """The checked values of one TOML table (``section``: ``[node]``, ``[learning.cordial]``):
    an unknown key, a missing required one or a bad value is a :class:`ConfigError` naming it.
    Relative paths are made relative to ``base`` (the config file's folder)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{section} must be a table, got {shown(raw)}")
    unknown = sorted(set(raw) - set(checks))
    if unknown:
        raise ConfigError(f"{section} {unknown[0]}: unknown key "
                          f"(known: {', '.join(sorted(checks))})")
    for key in required:
        if key not in raw:
            raise ConfigError(f"{section} {key}: required (see `peerd init --fleet DIR`)")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        values[key] = check_value(f"{section} {key}", checks[key], value)
        if isinstance(values[key], Path) and base is not None:
            # Relative paths are relative to the config file, not to the daemon's cwd
            # (systemd starts it in /), so a config that works by hand works as a service.
            values[key] = base / values[key]
    return values
