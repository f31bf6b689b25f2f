"""`peerd status`: what the running daemon is doing (a thin client of the control API).

The socket is ``--socket``, else ``[node] socket`` of ``--config``, else that of
``/etc/peerd/peerd.toml`` if it exists, else ``/run/peerd/peerd.sock``.

Exit status: 0 the daemon answered; 3 the daemon is not running (with ``--state-dir DIR``
its persisted state is printed first, marked as such); 1 any other failure (access denied,
timeout, bad config, an answer that is not a status).

Thin: the status' shape is :mod:`peerd.control.status`'s (this module only renders it),
the socket is :mod:`peerd.control.server`'s, and the persisted state is read through
:mod:`peerd.store.statedir` and :mod:`peerd.store.keyfile`, never parsed here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from peerd.control.server import DEFAULT_TIMEOUT_S, ControlError, decode_result, request
from peerd.control.status import (
    OfflineCacheRow,
    OfflineNode,
    OfflineStatus,
    Status,
    from_json,
    to_json,
)
from peerd.daemon.config import DEFAULT_CONFIG_PATH, DEFAULT_SOCKET, ConfigError, load_config
from peerd.protocol.identity import node_id_of
from peerd.store.keyfile import NODE_KEY_FILE, KeyFileError, read_private_key
from peerd.store.statedir import StateDir, StateError, persisted_cache

EXIT_ERROR = 1
#: Like `systemctl status` for an inactive unit: scripts can tell "down" from "broken".
EXIT_NOT_RUNNING = 3

T = TypeVar("T")

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


def decode(socket: Path, answer: dict[str, Any], how: Callable[[dict[str, Any]], T]) -> T:
    """The typed form of the daemon's answer; exits 1 (with the reason) on a wrong shape."""
    try:
        return decode_result(socket, how, answer)
    except ControlError as exc:
        raise fail(exc) from None


def _fmt(value: float | str | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _short(node_id: str | None) -> str:
    # Ed25519 peer ids share the "12D3KooW" prefix: the tail is what tells nodes apart.
    text = str(node_id)
    return text if len(text) <= 16 else f"…{text[-12:]}"


def _ts(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(stamp))


def render_status(console: Console, status: Status) -> None:
    node, cfg = status.node, status.config
    console.print(f"[bold]node[/bold] {node.id}  fleet {node.fleet}")
    console.print(f"round {_fmt(node.round)}  version {_fmt(node.version)}  "
                  f"examples {_fmt(node.examples)}  "
                  f"train loss {_fmt(node.train_loss)}  "
                  f"val accuracy {_fmt(node.val_accuracy)}")
    console.print(f"τ_max {_fmt(cfg.tau_max, 1)}  C {_fmt(cfg.capacity)}  "
                  f"ρ {_fmt(cfg.rho, 4)}  K {_fmt(cfg.local_steps)}  "
                  f"α {_fmt(cfg.alpha)}")
    cache = status.cache
    table = Table(title=f"cache ({len(cache)} entries)")
    for col in ("origin", "version", "age s", "staleness", "examples", "α", "drift",
                "from", "received", "verified"):
        # fold, not "…": a cut-off id or number is worse than a wrapped one
        table.add_column(col, justify="left" if col in ("origin", "from") else "right",
                         overflow="fold")
    for e in cache:
        table.add_row(_short(e.origin), _fmt(e.version), _fmt(e.age_s, 1),
                      _fmt(e.staleness, 1), _fmt(e.examples), _fmt(e.alpha), _fmt(e.drift, 4),
                      _short(e.received_from), _ts(e.received_at), _fmt(e.verified))
    console.print(table)
    peers = status.peers
    connected = sum(1 for p in peers if p.connected)
    console.print(f"peers: {connected} connected, {len(peers)} known (`peerd peers` for details)")
    rejected = status.rejected
    if rejected:
        rt = Table(title="rejected entries")
        rt.add_column("reason")
        rt.add_column("count", justify="right")
        for reason, count in sorted(rejected.items()):
            rt.add_row(str(reason), str(count))
        console.print(rt)
    else:
        console.print("rejected entries: none")


def offline_status(state_dir: Path) -> OfflineStatus:
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
    # The cache index is read (and its values typed) by peerd.store.statedir, which owns it.
    cache = [OfflineCacheRow(origin=e.origin, version=e.version,
                             received_from=e.received_from, received_at=e.received_at,
                             blob=e.blob, bytes=e.size)
             for e in persisted_cache(state)]
    return OfflineStatus(running=False, state_dir=str(state_dir),
                         node=OfflineNode(id=node_id, round=counters.round,
                                          version=counters.version,
                                          counters_lost=counters.lost),
                         cache=tuple(cache))


def _print_offline(console: Console, info: OfflineStatus, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(to_json(info), indent=2))
        return
    node = info.node
    console.print(f"[bold]peerd is not running[/bold]; persisted state in {info.state_dir}:")
    console.print(f"node {node.id or '- (no readable node.key)'}  round {node.round}  "
                  f"version {node.version}")
    if node.counters_lost:
        console.print("[red]the counter files were corrupt and have been quarantined[/red]")
    table = Table(title=f"persisted cache ({len(info.cache)} entries, not verified)")
    for col in ("origin", "version", "from", "received", "bytes"):
        table.add_column(col, justify="right" if col in ("version", "bytes") else "left",
                         overflow="fold")
    for c in info.cache:
        table.add_row(c.origin, _fmt(c.version), _short(c.received_from),
                      _ts(c.received_at), str(c.bytes))
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
    typed = decode(path, answer, from_json)  # also for --json: never print a non-status
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
    else:
        render_status(console, typed)
