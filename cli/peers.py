"""`peerd peers`: the daemon's known peers and traffic (a thin client of the control API).

Same socket resolution and exit status as `peerd status` (3: the daemon is not running).
"""

from __future__ import annotations

import json
import time
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from peerd.cli.status import (
    ConfigOption,
    JsonOption,
    SocketOption,
    TimeoutOption,
    ask,
    fail,
    resolve_socket,
)
from peerd.control.server import DEFAULT_TIMEOUT_S, ControlError


def _ago(now: float, stamp: Any) -> str:
    if not isinstance(stamp, int | float):
        return "never"
    return f"{max(0.0, now - stamp):.0f} s ago"


def render_peers(console: Console, peers: list[dict[str, Any]], now: float) -> None:
    table = Table(title=f"peers ({len(peers)})")
    for col in ("id", "connected", "last seen", "bytes in", "bytes out", "addresses"):
        table.add_column(col, justify="right" if col.startswith("bytes") else "left",
                         overflow="fold")
    for p in peers:
        table.add_row(str(p.get("id", "-")), "yes" if p.get("connected") else "no",
                      _ago(now, p.get("last_seen")), str(p.get("bytes_in", "-")),
                      str(p.get("bytes_out", "-")), "\n".join(map(str, p.get("addrs", []))))
    console.print(table)


def peers(
    as_json: JsonOption = False,
    config: ConfigOption = None,
    socket: SocketOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
) -> None:
    """List the peers the daemon knows: connection state, last seen, bytes in and out."""
    answer = ask(resolve_socket(socket, config), "peers", timeout)
    if isinstance(answer, ControlError):
        raise fail(answer)
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    render_peers(Console(), list(answer.get("peers", [])), time.time())
