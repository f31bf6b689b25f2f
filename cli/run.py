"""`peerd run`: run the node in the foreground (systemd supervises it).

Thin: loads the config, runs the start-up checks of :mod:`peerd.daemon.preflight` (the state
directory's lock first) and runs :class:`peerd.daemon.daemon.Daemon`. The daemon, torch and
libp2p are imported only after those checks pass, so the other commands stay light and a
config or port error is reported in a fraction of a second, not after 4 to 5 s of imports.

Every start-up failure is one line on stderr (``peerd: ...``) and exit status 2, which the
systemd unit does not restart (``RestartPreventExitStatus=2``): a config, key, manifest,
dataset, port, control socket or lock problem is not fixed by trying again.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from peerd.daemon.config import DEFAULT_CONFIG_PATH as DEFAULT_CONFIG
from peerd.daemon.config import STATE_DIR_ENV

#: Exit status of a start-up failure (see the module docstring).
EXIT_STARTUP = 2


def _startup_failure(exc: BaseException) -> typer.Exit:
    # One line, whatever the message: a journal or a script reads the first line only.
    typer.echo(f"peerd: {' '.join(str(exc).split())}", err=True)
    return typer.Exit(code=EXIT_STARTUP)


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, as trio's nursery raises them."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def run(
    config: Annotated[Path, typer.Option(
        "--config", "-c", readable=False, metavar="FILE",
        help="Config file (TOML).")] = DEFAULT_CONFIG,
    state_dir: Annotated[Path | None, typer.Option(
        "--state-dir", envvar=STATE_DIR_ENV, readable=False,
        help="Override \\[node] state_dir (and the socket derived from it).")] = None,
) -> None:
    """Join the fleet: discover peers, gossip signed entries, train and blend, until SIGTERM."""
    import dataclasses

    # Only what the config and the preflight checks need: torch, libp2p and the daemon
    # (4 to 5 s of CPU) are imported after them, so a typo or a taken port fails at once.
    from peerd.daemon.config import ConfigError, load_config
    from peerd.daemon.preflight import DaemonError, LateStartupError, preflight

    try:
        cfg = load_config(config)
        if state_dir is not None:
            # Absolute: the lock file and `peerd status` name it, whatever the cwd.
            cfg = dataclasses.replace(cfg, node=dataclasses.replace(
                cfg.node, state_dir=state_dir.absolute()))
        logging.basicConfig(
            level=cfg.node.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        lock = preflight(cfg)  # before any state is read; held until the process ends
    except (ConfigError, DaemonError) as exc:
        raise _startup_failure(exc) from None
    import trio

    from peerd.control.server import ControlError
    from peerd.daemon.daemon import Daemon
    from peerd.learn.data import DataError
    from peerd.learn.tasks import TaskError
    from peerd.net.transport import TransportError
    from peerd.store.statedir import StateError

    try:
        daemon = Daemon(cfg)
    except (DaemonError, StateError, TaskError, DataError, FileNotFoundError) as exc:
        # Each names what is wrong and how to fix it (e.g. a dataset package to install).
        lock.release()
        raise _startup_failure(exc) from None
    try:
        trio.run(daemon.run)
    except BaseException as exc:
        # A port or socket taken between the checks and the listen: still a start-up
        # failure while the daemon was not ready; after that, a crash (traceback, exit 1).
        startup = (DaemonError, TransportError, ControlError, OSError)
        leaves = _leaves(exc)
        late = [e for e in leaves if isinstance(e, LateStartupError)]
        if late:  # the data or mDNS, started after READY=1 (systemd stops on 2)
            raise _startup_failure(late[0]) from None
        if not daemon.ready.is_set() and all(isinstance(e, startup) for e in leaves):
            raise _startup_failure(leaves[0]) from None
        raise
    finally:
        lock.release()
