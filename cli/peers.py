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


def _short(peer_id: str) -> str:
    return peer_id if len(peer_id) <= 14 else f"{peer_id[:6]}…{peer_id[-6:]}"


def path_text(p: PeerRow) -> str:
    """``lan``, ``direct``, ``hole-punched``, ``relayed via 12D3Ko…abcdef`` (``-``: not
    connected, or its path not known yet)."""
    if p.path is None:
        return "-"
    if p.path == "relayed":
        return "relayed" if p.relay is None else f"relayed via {_short(p.relay)}"
    return p.path


def rtt_text(p: PeerRow) -> str:
    """The smoothed RTT (``-`` until a ping succeeded): 0.42 ms, 3.1 ms, 41 ms."""
    if p.rtt_ms is None:
        return "-"
    ms = p.rtt_ms
    return f"{ms:.2f} ms" if ms < 1 else f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def render_peers(console: Console, peers: tuple[PeerRow, ...], now: float) -> None:
    table = Table(title=f"peers ({len(peers)})")
    for col in ("id", "source", "connected", "path", "rtt", "last seen", "bytes in",
                "bytes out", "backoff", "addresses"):
        table.add_column(col, justify="right" if col.startswith("bytes") or col == "rtt"
                         else "left", overflow="fold")
    for p in peers:
        table.add_row(p.id, p.source, "yes" if p.connected else "no", path_text(p),
                      rtt_text(p), _ago(now, p.last_seen), str(p.bytes_in), str(p.bytes_out),
                      _backoff(p), "\n".join(p.addrs))
    console.print(table)


def peers(
    as_json: JsonOption = False,
    config: ConfigOption = None,
    socket: SocketOption = None,
    state_dir: StateDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
) -> None:
    """List the peers the daemon knows, with their connection state and traffic.

    Per peer: connection state, how it is reached (lan, direct, hole-punched, relayed via a
    relay), its round-trip time (libp2p ping, smoothed), last seen, bytes in and out, and the
    backoff of a peer that failed (failures in a row, seconds until the next dial)."""
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
