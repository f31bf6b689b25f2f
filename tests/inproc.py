"""The `peerd` command run inside the test process, for the set-up steps of tests that are
about something else (a fleet, keys, configs to break or run).

A subprocess of the console command costs ~0.5 s of CPU in imports alone; a fixture that
builds a node with four of them spent more than the test itself. The commands' behaviour
as real processes is the subject of tests/cli/ (test_cli_keygen_fleet.py and others); here
only their effect on disk matters. An exception the command did not turn into an exit
status is raised, not hidden in a return code.
"""

from __future__ import annotations

import subprocess

from typer.testing import CliRunner

from peerd.cli.app import app


def peerd_inproc(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``peerd ARGS`` as :func:`subprocess.run` would report it (``check``: fail, with the
    command's stderr, on a non-zero exit status)."""
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    done = subprocess.CompletedProcess(["peerd", *args], result.exit_code, result.stdout,
                                       result.stderr)
    assert not check or done.returncode == 0, f"peerd {' '.join(args)}: {done.stderr}"
    return done
