"""The typer application. This module only registers commands; each lives in its own module."""

from __future__ import annotations

import typer

from peerd.cli import demo, fleet, keygen
from peerd.cli import flags as flags_cmd
from peerd.cli import init as init_cmd
from peerd.cli import peers as peers_cmd
from peerd.cli import run as run_cmd
from peerd.cli import sim as sim_cmd
from peerd.cli import status as status_cmd

app = typer.Typer(
    name="peerd",
    help="Decentralized federated learning daemon (Cached-DFL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("demo")(demo.demo)
app.command("keygen")(keygen.keygen)
app.add_typer(fleet.app, name="fleet")
app.command("sim")(sim_cmd.sim)
app.command("init")(init_cmd.init)
app.command("run")(run_cmd.run)
app.command("status")(status_cmd.status)
app.command("peers")(peers_cmd.peers)
app.add_typer(flags_cmd.app, name="flags")


def main() -> None:
    app()
