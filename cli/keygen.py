"""`peerd keygen`: create this node's Ed25519 identity key and print its node id.

Owns only the default state directory's resolution; the key file (format, mode, atomic
write) is :mod:`peerd.store.keyfile`'s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from peerd.protocol.identity import node_id_of
from peerd.store.keyfile import NODE_KEY_FILE, KeyFileError, new_node_key, read_private_key


def default_state_dir() -> Path:
    """``$PEERD_STATE_DIR``, else ``$XDG_STATE_HOME/peerd``, else ``~/.local/state/peerd``."""
    env = os.environ.get("PEERD_STATE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "peerd"


StateDirOption = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="State directory (default: $PEERD_STATE_DIR or "
        "$XDG_STATE_HOME/peerd or ~/.local/state/peerd).",
    ),
]


def keygen(
    state_dir: StateDirOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing key (the node id changes).")
    ] = False,
) -> None:
    """Create the node's Ed25519 key (mode 0600) and print its node id."""
    directory = state_dir or default_state_dir()
    path = directory / NODE_KEY_FILE
    if path.exists() and not force:
        try:
            existing = node_id_of(read_private_key(path))
        except KeyFileError as exc:
            existing = f"unreadable: {exc}"
        typer.echo(
            f"error: {path} already exists (node id {existing}); use --force to replace it",
            err=True,
        )
        raise typer.Exit(1)
    try:
        key = new_node_key(directory, overwrite=force)
    except FileExistsError:
        typer.echo(f"error: {path} was created concurrently; not overwritten", err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"error: cannot write {path}: {exc.strerror}", err=True)
        raise typer.Exit(1) from None
    typer.echo(node_id_of(key))
