"""`peerd status`: what the running daemon is doing (a thin client of the control API).

The socket is ``--socket``, else ``[node] socket`` of ``--config``, else that of
``/etc/peerd/peerd.toml`` if it exists, else ``/run/peerd/peerd.sock``.

Exit status: 0 the daemon answered; 3 the daemon is not running (with ``--state-dir DIR``
its persisted state is printed first, marked as such); 1 any other failure (access denied,
timeout, bad config).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from peerd.control.server import DEFAULT_TIMEOUT_S, ControlError, request
from peerd.daemon.config import DEFAULT_CONFIG_PATH, DEFAULT_SOCKET, ConfigError, load_config
from peerd.protocol.identity import node_id_of
from peerd.store.keyfile import NODE_KEY_FILE, KeyFileError, read_private_key
from peerd.store.statedir import CACHE_INDEX_BLOB, ENTRY_BLOB_PREFIX, StateDir, StateError

EXIT_ERROR = 1
#: Like `systemctl status` for an inactive unit: scripts can tell "down" from "broken".
EXIT_NOT_RUNNING = 3

JsonOption = Annotated[bool, typer.Option("--json", help="Print the daemon's JSON as is.")]
# readable=False: click's own readability check would pre-empt ours with a usage error; an
# unreadable config or a socket we may not use gets the documented message and exit status.
# "\\[node]": rich would take a bare [node] in help text for markup and drop it.
ConfigOption = Annotated[Path | None, typer.Option(
    "--config", readable=False, help="Daemon config file (its \\[node] socket is used).")]
SocketOption = Annotated[Path | None, typer.Option(
    "--socket", readable=False, help="Control socket path.")]
TimeoutOption = Annotated[float, typer.Option(
    "--timeout", min=0.1, max=600.0, help="Seconds to wait for the daemon.")]


def resolve_socket(socket: Path | None, config: Path | None) -> Path:
    if socket is not None:
        return socket
    if config is not None:
        try:
            return load_config(config).node.socket
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(EXIT_ERROR) from None
    if DEFAULT_CONFIG_PATH.is_file():
        try:
            return load_config(DEFAULT_CONFIG_PATH).node.socket
        except ConfigError:
            pass  # unreadable to this user or broken: the daemon's default still applies
    return DEFAULT_SOCKET


def ask(socket: Path, method: str, timeout: float) -> dict[str, Any] | ControlError:
    """The daemon's answer, or the ControlError (callers decide how to report it)."""
    try:
        return request(socket, method, timeout)
    except ControlError as exc:
        return exc


def fail(exc: ControlError, *, hint: str = "") -> typer.Exit:
    typer.echo(f"error: {exc.message}{hint}", err=True)
    return typer.Exit(EXIT_NOT_RUNNING if exc.code == "not_running" else EXIT_ERROR)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _short(node_id: Any) -> str:
    # Ed25519 peer ids share the "12D3KooW" prefix: the tail is what tells nodes apart.
    text = str(node_id)
    return text if len(text) <= 16 else f"…{text[-12:]}"


def _ts(stamp: Any) -> str:
    if not isinstance(stamp, int | float):
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(stamp))


def render_status(console: Console, status: dict[str, Any]) -> None:
    node = status.get("node", {})
    cfg = status.get("config", {})
    console.print(f"[bold]node[/bold] {node.get('id', '-')}  fleet {node.get('fleet', '-')}")
    console.print(f"round {_fmt(node.get('round'))}  version {_fmt(node.get('version'))}  "
                  f"examples {_fmt(node.get('examples'))}  "
                  f"train loss {_fmt(node.get('train_loss'))}  "
                  f"val accuracy {_fmt(node.get('val_accuracy'))}")
    console.print(f"τ_max {_fmt(cfg.get('tau_max'), 1)}  C {_fmt(cfg.get('capacity'))}  "
                  f"ρ {_fmt(cfg.get('rho'), 4)}  K {_fmt(cfg.get('local_steps'))}  "
                  f"α {_fmt(cfg.get('alpha'))}")
    cache = status.get("cache", [])
    table = Table(title=f"cache ({len(cache)} entries)")
    for col in ("origin", "version", "age s", "staleness", "examples", "α", "drift",
                "from", "received", "verified"):
        # fold, not "…": a cut-off id or number is worse than a wrapped one
        table.add_column(col, justify="left" if col in ("origin", "from") else "right",
                         overflow="fold")
    for e in cache:
        table.add_row(_short(e.get("origin")), _fmt(e.get("version")), _fmt(e.get("age_s"), 1),
                      _fmt(e.get("staleness"), 1), _fmt(e.get("examples")),
                      _fmt(e.get("alpha")), _fmt(e.get("drift"), 4),
                      _short(e.get("received_from")), _ts(e.get("received_at")),
                      _fmt(e.get("verified")))
    console.print(table)
    peers = status.get("peers", [])
    connected = sum(1 for p in peers if p.get("connected"))
    console.print(f"peers: {connected} connected, {len(peers)} known (`peerd peers` for details)")
    rejected = status.get("rejected", {})
    if rejected:
        rt = Table(title="rejected entries")
        rt.add_column("reason")
        rt.add_column("count", justify="right")
        for reason, count in sorted(rejected.items()):
            rt.add_row(str(reason), str(count))
        console.print(rt)
    else:
        console.print("rejected entries: none")


def offline_status(state_dir: Path) -> dict[str, Any]:
    """What the state directory says while the daemon is down (``"running": false``)."""
    if not state_dir.is_dir():
        raise StateError(2, f"no state directory at {state_dir}")
    try:
        node_id: str | None = node_id_of(read_private_key(state_dir / NODE_KEY_FILE))
    except KeyFileError:
        node_id = None
    # Read-only: a daemon may be running after all (e.g. on another socket); creating,
    # tightening, cleaning temporary files or quarantining here would pull files from under it.
    state = StateDir(state_dir, readonly=True)
    counters = state.load_counters()
    index = _cache_index(state)
    cache = []
    for name in state.list_blobs(ENTRY_BLOB_PREFIX):
        origin = name.removeprefix(ENTRY_BLOB_PREFIX)
        meta = index.get(origin)
        meta = meta if isinstance(meta, dict) else {}
        cache.append({"origin": origin, "version": meta.get("version"),
                      "received_from": meta.get("received_from"),
                      "received_at": meta.get("received_at"),
                      "blob": name, "bytes": (state.blobs / name).stat().st_size})
    return {"running": False, "state_dir": str(state_dir),
            "node": {"id": node_id, "round": counters.round, "version": counters.version,
                     "counters_lost": counters.lost},
            "cache": cache}


def _cache_index(state: StateDir) -> dict[str, Any]:
    # Written by the daemon (peerd.store.persist); its absence or an odd shape only costs detail.
    raw = state.read_blob(CACHE_INDEX_BLOB)
    try:
        index = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}
    return index if isinstance(index, dict) else {}


def _print_offline(console: Console, info: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    node = info["node"]
    console.print(f"[bold]peerd is not running[/bold]; persisted state in {info['state_dir']}:")
    console.print(f"node {node['id'] or '- (no readable node.key)'}  round {node['round']}  "
                  f"version {node['version']}")
    if node["counters_lost"]:
        console.print("[red]the counter files were corrupt and have been quarantined[/red]")
    table = Table(title=f"persisted cache ({len(info['cache'])} entries, not verified)")
    for col in ("origin", "version", "from", "received", "bytes"):
        table.add_column(col, justify="right" if col in ("version", "bytes") else "left",
                         overflow="fold")
    for c in info["cache"]:
        table.add_row(str(c["origin"]), _fmt(c["version"]), _short(c["received_from"]),
                      _ts(c["received_at"]), str(c["bytes"]))
    console.print(table)


def status(
    as_json: JsonOption = False,
    config: ConfigOption = None,
    socket: SocketOption = None,
    state_dir: Annotated[Path | None, typer.Option(
        "--state-dir", readable=False,
        help="If the daemon is down, show the state persisted here.")] = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
) -> None:
    """Show the daemon's round, model quality, cache and rejected entries."""
    path = resolve_socket(socket, config)
    answer = ask(path, "status", timeout)
    console = Console()
    if isinstance(answer, ControlError):
        if answer.code != "not_running" or state_dir is None:
            hint = ("; use --state-dir DIR to read its persisted state"
                    if answer.code == "not_running" else "")
            raise fail(answer, hint=hint)
        try:
            info = offline_status(state_dir)
        except (StateError, OSError) as exc:
            typer.echo(f"error: {answer.message}; and cannot read {state_dir}: {exc}", err=True)
            raise typer.Exit(EXIT_NOT_RUNNING) from None
        _print_offline(console, info, as_json)
        raise typer.Exit(EXIT_NOT_RUNNING)
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
    else:
        render_status(console, answer)
