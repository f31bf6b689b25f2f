"""`peerd peers`: the daemon's known peers and traffic (a thin client of the control API).

Same socket resolution and exit status as `peerd status` (3: the daemon is not running).
The rows are :class:`peerd.control.status.PeerRow`; this module only renders them.
"""

from __future__ import annotations

import json
import time

import typer
from rich.console import Console
from rich.table import Table

from peerd.cli.status import (
    ConfigOption,
    JsonOption,
    SocketOption,
    StateDirOption,
    TimeoutOption,
    ask,
    decode,
    fail,
    not_running,
    resolve_socket,
)
from peerd.control.server import DEFAULT_TIMEOUT_S, ControlError
from peerd.control.status import PeerRow, peers_from_json


def _ago(now: float, stamp: float | None) -> str:
    if stamp is None:
        return "never"
    return f"{max(0.0, now - stamp):.0f} s ago"


def _backoff(p: PeerRow) -> str:
    """``-``, or the failures in a row and when the next dial may start."""
    if not p.failures:
        return "-"
    retry = "" if p.retry_in_s is None else f", retry in {p.retry_in_s:.0f} s"
    return f"{p.failures} failed{retry}"


def render_peers(console: Console, peers: tuple[PeerRow, ...], now: float) -> None:
    table = Table(title=f"peers ({len(peers)})")
    for col in ("id", "source", "connected", "last seen", "bytes in", "bytes out", "backoff",
                "addresses"):
        table.add_column(col, justify="right" if col.startswith("bytes") else "left",
                         overflow="fold")
    for p in peers:
        table.add_row(p.id, p.source, "yes" if p.connected else "no", _ago(now, p.last_seen),
                      str(p.bytes_in), str(p.bytes_out), _backoff(p), "\n".join(p.addrs))
    console.print(table)


def peers(
    as_json: JsonOption = False,
    config: ConfigOption = None,
    socket: SocketOption = None,
    state_dir: StateDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
) -> None:
    """List the peers the daemon knows, with their connection state and traffic.

    Per peer: connection state, last seen, bytes in and out, and the backoff of a peer that
    failed (failures in a row, seconds until the next dial)."""
    path = resolve_socket(socket, config, state_dir)
    if path is None:
        raise fail(not_running(path, state_dir))
    answer = ask(path, "peers", timeout)
    if isinstance(answer, ControlError):
        raise fail(answer)
    rows = decode(path, answer, peers_from_json)  # also for --json: never print a non-status
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    render_peers(Console(), rows, time.time())
