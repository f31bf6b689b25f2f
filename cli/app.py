"""The typer application. This module only registers commands; each lives in its own module."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Annotated

import typer

from peerd.cli import audit as audit_cmd
from peerd.cli import demo, fleet, keygen
from peerd.cli import export as export_cmd
from peerd.cli import flags as flags_cmd
from peerd.cli import init as init_cmd
from peerd.cli import peers as peers_cmd
from peerd.cli import relay as relay_cmd
from peerd.cli import run as run_cmd
from peerd.cli import sim as sim_cmd
from peerd.cli import status as status_cmd
from peerd.cli.conventions import ConventionalGroup
from peerd.cli.fastexit import run_and_exit

app = typer.Typer(
    name="peerd",
    help="Decentralized federated learning daemon (Cached-DFL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # ConventionalGroup: PATH / NODE_ID metavars, no <bool>, -h, for every command below it.
    cls=ConventionalGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version() -> str:
    try:
        return package_version("peerd")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"peerd {_version()}")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="Print the version and exit.")] = False,
) -> None:
    """Decentralized federated learning daemon (Cached-DFL)."""


app.command("demo")(demo.demo)
app.command("keygen")(keygen.keygen)
app.add_typer(fleet.app, name="fleet")
app.add_typer(sim_cmd.app, name="sim")
app.command("init")(init_cmd.init)
app.command("run")(run_cmd.run)
app.command("status")(status_cmd.status)
app.command("peers")(peers_cmd.peers)
app.command("relay")(relay_cmd.relay)
app.command("audit")(audit_cmd.audit)
app.command("export")(export_cmd.export)
app.add_typer(flags_cmd.app, name="flags")


def main() -> None:
    """The console command (tests call ``app`` itself, in-process)."""
    run_and_exit(app)
