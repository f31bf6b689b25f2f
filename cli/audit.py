"""`peerd audit`: who took part in each round, with which α and weight, and who was refused.

Asks the running daemon (the control API's ``audit``, same socket resolution as `peerd
status`); when no daemon holds the state directory (``--state-dir DIR``, or the state
directory of ``--config``), reads the round log there instead, read-only. Which source
answered is said on stderr and in the JSON (``"source": "daemon" | "state_dir"``).

Exit status: 0 the audit was shown (from either source); 3 the daemon is not running and
no state directory could be read; 1 any other failure.

Thin: the records are :mod:`peerd.control.audit`'s, the file :mod:`peerd.store.roundlog`'s;
this module only chooses the source and renders.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from peerd.cli.status import (
    EXIT_NOT_RUNNING,
    ConfigOption,
    SocketOption,
    StateDirOption,
    TimeoutOption,
    fail,
    not_running,
    resolve_socket,
)
from peerd.control.audit import (
    Audit,
    AuditLearner,
    RoundRecord,
    audit_to_json,
    read_offline,
    request_audit,
)
from peerd.control.server import DEFAULT_TIMEOUT_S, ControlError
from peerd.daemon.config import DEFAULT_CONFIG_PATH, ConfigError, load_config

JsonOption = Annotated[bool, typer.Option(
    "--json", help="Print the audit as JSON (with its source: daemon or state_dir).")]


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}" if abs(x) >= 1e4 else f"{x:.{digits}f}"


#: Metrics of one kind (fit, evaluate) shown on a round's line; --json has them all.
SHOWN_METRICS = 6


def _metrics_text(metrics: Mapping[str, float]) -> str:
    shown = [f"{k} {_num(v, 4)}" for k, v in list(metrics.items())[:SHOWN_METRICS]]
    more = len(metrics) - SHOWN_METRICS
    return "  ".join(shown) + (f"  (+{more} more)" if more > 0 else "")


def _learner_view(console: Console, lr: AuditLearner) -> None:
    """One line for a learner's metrics (fit, then evaluate), one for its refusal."""
    parts = [f"{what}: {_metrics_text(m)}" for what, m in (("fit", lr.fit_metrics),
                                                            ("eval", lr.eval_metrics)) if m]
    if parts:
        console.print(Text("  learner " + "; ".join(parts)), soft_wrap=True)
    if lr.failure is not None:
        console.print(Text(f"  learner refused: {lr.failure}"
                           + ("" if lr.detail is None else f" ({lr.detail})"), style="red"),
                      soft_wrap=True)


def _record_view(console: Console, r: RoundRecord) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.ts))
    published = "-" if r.published is None else f"v{r.published}"
    head = Text(f"round {r.round}  {stamp}  {r.mode}  blend {r.blend}  published {published}",
                style="bold")
    console.print(head)
    if r.blend_refused is not None:
        console.print(Text(f"  blended nothing: {r.blend_refused}", style="red"))
    table = Table(show_edge=False, pad_edge=False)
    for col in ("member", "version", "α", "weight", "staleness", "drift", "update norm",
                "verdict"):
        table.add_column(col, justify="left" if col in ("member", "verdict") else "right",
                         overflow="fold")
    for i, m in enumerate(r.members):
        name = f"{m.origin} (own)" if i == 0 else m.origin
        table.add_row(Text(name), "-" if m.version is None else str(m.version),
                      _num(m.alpha), _num(m.weight), _num(m.staleness, 1), _num(m.drift, 4),
                      _num(m.update_norm, 4),
                      Text(m.verdict, style="red" if m.verdict == "rejected" else ""))
    console.print(table)
    if r.refused or r.refused_more:
        rows = [f"{x.peer} {x.reason} ×{x.count}" for x in r.refused]
        if r.refused_more:
            rows.append(f"{r.refused_more} more")
        console.print(Text("  refused: " + "; ".join(rows), style="yellow"))
    if r.expired:
        console.print(Text("  expired: " + ", ".join(f"{e.origin}@{e.version}"
                                                      for e in r.expired)))
    if r.withdrawn:  # flagged or gone from the manifest: out of the blend, and why
        console.print(Text("  withdrawn: " + ", ".join(f"{w.origin}@{w.version} ({w.reason})"
                                                        for w in r.withdrawn), style="red"))
    if r.learner is not None:
        _learner_view(console, r.learner)


def render_audit(console: Console, audit: Audit) -> None:
    for r in audit.records:
        _record_view(console, r)
    if not audit.records:
        console.print("no rounds recorded")
    if audit.skipped:
        console.print(Text(f"{audit.skipped} torn or corrupt record(s) skipped", style="red"))


def _state_dir_of(state_dir: Path | None, config: Path | None) -> Path | None:
    """Where to read the log offline: ``--state-dir``, else the config's state directory."""
    if state_dir is not None:
        return state_dir
    path = config if config is not None else (
        DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None)
    if path is None:
        return None
    with contextlib.suppress(ConfigError):
        return load_config(path).node.state_dir
    return None


def audit(
    since: Annotated[int | None, typer.Option(
        "--since", min=0, metavar="ROUND", help="Only rounds from this one on.")] = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
    socket: SocketOption = None,
    state_dir: StateDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
) -> None:
    """Show each round's participation: who was blended, refused, expired or withdrawn.

    Per round: the members blended with α and weight, staleness and drift, the entries
    refused (with reasons), expired, and withdrawn (origin flagged for equivocation, or
    revoked); with a learner of the user's, its fit and evaluation metrics or why the round
    was refused. Reads the state directory when the daemon is not
    running."""
    path = resolve_socket(socket, config, state_dir)
    answer: Audit | ControlError
    try:
        answer = (request_audit(path, since, timeout) if path is not None
                  else not_running(path, state_dir))
    except ControlError as exc:
        answer = exc
    if isinstance(answer, ControlError):
        down = answer
        offline = _state_dir_of(state_dir, config) if down.code == "not_running" else None
        if offline is None:
            raise fail(down, hint="; use --state-dir DIR to read its audit"
                       if down.code == "not_running" else "")
        try:
            answer = read_offline(offline, since)
        except OSError as exc:
            typer.echo(f"error: {down.message}; and cannot read {offline}: {exc}", err=True)
            raise typer.Exit(EXIT_NOT_RUNNING) from None
        typer.echo(f"peerd is not running: audit read from {offline}", err=True)
    else:
        typer.echo(f"audit from the running daemon ({path})", err=True)
    if as_json:
        typer.echo(json.dumps(audit_to_json(answer), indent=2))
    else:
        render_audit(Console(), answer)
