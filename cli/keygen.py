"""`peerd keygen`: create this node's Ed25519 identity key and print its node id.

The state directory is the one every command uses: ``--state-dir``, else
``$PEERD_STATE_DIR``, else ``/var/lib/peerd`` (docs/operations.md, "Paths"). The node id goes
to stdout (scripts read it), where the key was written to stderr. The key file (format,
mode, atomic write) is :mod:`peerd.store.keyfile`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from peerd.daemon.config import DEFAULT_STATE_DIR, STATE_DIR_ENV
from peerd.protocol.identity import node_id_of
from peerd.store.keyfile import NODE_KEY_FILE, KeyFileError, new_node_key, read_private_key

StateDirOption = Annotated[
    Path,
    typer.Option(
        "--state-dir", envvar=STATE_DIR_ENV,
        help="State directory (default: $PEERD_STATE_DIR, else /var/lib/peerd).",
    ),
]


def keygen(
    state_dir: StateDirOption = DEFAULT_STATE_DIR,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing key (the node id changes).")
    ] = False,
) -> None:
    """Create the node's Ed25519 key (mode 0600) and print its node id."""
    directory = state_dir.absolute()
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
        hint = (" (run it as the daemon's user, e.g. `sudo -u peerd peerd keygen`, or give "
                "--state-dir DIR)") if isinstance(exc, PermissionError) else ""
        typer.echo(f"error: cannot write {path}: {exc.strerror}{hint}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {path} (mode 0600); node id:", err=True)
    typer.echo(node_id_of(key))
