"""`peerd flags` and `peerd flags clear ORIGIN`: origins flagged for equivocation.

An origin that signed two different entries under one version is flagged and its entries are
refused until an operator clears the flag (docs/protocol.md). The flag is persisted in the
state directory, so it survives restarts.

Both commands ask the running daemon over its control socket (same socket resolution and
exit status as `peerd status`): the daemon holds the flags in memory and would write its own
over any change made beside it. Only when the daemon is not running, and ``--state-dir DIR``
is given, is the persisted ledger read (exit status 3, like `peerd status`) or changed (exit
status 0) directly, under the state directory's lock (refused while a daemon holds it).
Thin: the ledger file is :mod:`peerd.store.ledgerfile`'s, the socket
:mod:`peerd.control.server`'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from peerd.cli.status import (
    EXIT_ERROR,
    EXIT_NOT_RUNNING,
    ConfigOption,
    JsonOption,
    SocketOption,
    TimeoutOption,
    fail,
    not_running,
    resolve_socket,
)
from peerd.control.server import (
    DEFAULT_TIMEOUT_S,
    ControlError,
    request_clear_flag,
    request_flags,
)
from peerd.control.status import Flags, flags_to_json
from peerd.store import ledgerfile
from peerd.store import lock as state_lock
from peerd.store.statedir import StateDir, StateError

app = typer.Typer(
    help="Origins flagged for equivocation: list them, or clear one.",
    invoke_without_command=True,
)

StateDirOption = Annotated[Path | None, typer.Option(
    "--state-dir", envvar="PEERD_STATE_DIR", readable=False,
    help="If the daemon is down, use the ledger persisted here.")]


def _offline(state_dir: Path | None, answer: ControlError) -> StateDir:
    """The state directory to work on while the daemon is down, or the exit."""
    if answer.code != "not_running" or state_dir is None:
        hint = ("; use --state-dir DIR to work on its persisted state"
                if answer.code == "not_running" else "")
        raise fail(answer, hint=hint)
    if not state_dir.is_dir():
        typer.echo(f"error: {answer.message}; and no state directory at {state_dir}", err=True)
        raise typer.Exit(EXIT_NOT_RUNNING)
    return StateDir(state_dir, readonly=True)


def _print_persisted(state: StateDir, cleared: str | None, as_json: bool) -> None:
    """The flags in ``state``'s persisted ledger, as the daemon would list them."""
    view = ledgerfile.load(state)
    _print(Flags(running=False, flagged=tuple(sorted(view.flagged)) if view else (),
                 cleared=cleared), as_json)


def _print(flags: Flags, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(flags_to_json(flags), indent=2))
        return
    if flags.cleared is not None:
        typer.echo(f"cleared the flag of {flags.cleared}")
    where = "" if flags.running else " (persisted; the daemon is not running)"
    typer.echo(f"flagged origins{where}: {len(flags.flagged)}")
    for origin in flags.flagged:
        typer.echo(f"  {origin}")


@app.callback()
def flags(
    ctx: typer.Context,
    as_json: JsonOption = False,
    config: ConfigOption = None,
    socket: SocketOption = None,
    state_dir: StateDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
) -> None:
    """List the origins flagged for equivocation (their entries are refused)."""
    if ctx.invoked_subcommand is not None:
        return
    path = resolve_socket(socket, config, state_dir)
    try:
        if path is None:  # no daemon holds --state-dir: never ask another node's socket
            raise not_running(path, state_dir)
        _print(request_flags(path, timeout), as_json)
        return
    except ControlError as exc:
        state = _offline(state_dir, exc)
    _print_persisted(state, None, as_json)
    raise typer.Exit(EXIT_NOT_RUNNING)


@app.command("clear")
def clear(
    origin: Annotated[str, typer.Argument(metavar="NODE_ID",
                                          help="The flagged origin's node id.")],
    as_json: JsonOption = False,
    config: ConfigOption = None,
    socket: SocketOption = None,
    state_dir: StateDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
) -> None:
    """Accept a flagged origin's entries again (its older versions stay refused)."""
    path = resolve_socket(socket, config, state_dir)
    try:
        if path is None:
            raise not_running(path, state_dir)
        _print(request_clear_flag(path, origin, timeout), as_json)
        return
    except ControlError as exc:
        if exc.code == "not_flagged":
            raise fail(exc) from None
        _offline(state_dir, exc)
    assert state_dir is not None  # _offline exits otherwise
    try:
        # The daemon's own lock: a daemon that starts on this directory meanwhile (or one
        # whose socket is elsewhere) would write its ledger over this change.
        with state_lock.acquire(state_dir):
            state = StateDir(state_dir)
            cleared = ledgerfile.clear_flag(state, origin)
            if cleared:
                state.audit("flag_cleared", origin=origin, offline=True)
    except state_lock.StateLockError as exc:
        typer.echo(f"error: {exc}; clear the flag through that daemon's control socket "
                   "(--socket)", err=True)
        raise typer.Exit(EXIT_ERROR) from None
    except (StateError, OSError) as exc:
        typer.echo(f"error: cannot change the ledger in {state_dir}: {exc}", err=True)
        raise typer.Exit(EXIT_ERROR) from None
    if not cleared:
        typer.echo(f"error: {origin} is not flagged in {state_dir}", err=True)
        raise typer.Exit(EXIT_ERROR)
    _print_persisted(state, origin, as_json)
