"""`peerd run`: run the node in the foreground (systemd supervises it).

Thin: loads the config and runs :class:`peerd.daemon.daemon.Daemon`. The daemon, torch and
trio are imported only when the command runs, so the other commands stay light.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

DEFAULT_CONFIG = Path("/etc/peerd/peerd.toml")


def run(
    config: Annotated[Path, typer.Option(
        "--config", "-c", readable=False, help="Config file (TOML).")] = DEFAULT_CONFIG,
    state_dir: Annotated[Path | None, typer.Option(
        "--state-dir", readable=False, help="Override \\[node] state_dir.")] = None,
) -> None:
    """Join the fleet: discover peers, gossip signed entries, train and blend, until SIGTERM."""
    import dataclasses

    import trio

    from peerd.daemon.config import ConfigError, load_config
    from peerd.daemon.daemon import Daemon
    from peerd.daemon.startup import DaemonError
    from peerd.learn.data import DataError
    from peerd.learn.tasks import TaskError
    from peerd.store.statedir import StateError

    try:
        cfg = load_config(config)
        if state_dir is not None:
            cfg = dataclasses.replace(cfg, node=dataclasses.replace(cfg.node, state_dir=state_dir))
        logging.basicConfig(
            level=cfg.node.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        daemon = Daemon(cfg)
    except (ConfigError, DaemonError, StateError, TaskError, DataError) as exc:
        # Each names what is wrong and how to fix it (e.g. a dataset package to install).
        typer.echo(f"peerd: {exc}", err=True)
        raise typer.Exit(code=2) from None
    except FileNotFoundError as exc:
        typer.echo(f"peerd: {exc}", err=True)
        raise typer.Exit(code=2) from None
    trio.run(daemon.run)
