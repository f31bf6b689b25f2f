"""The typer application. This module only registers commands; each lives in its own module."""

from __future__ import annotations

import typer

from peerd.cli import demo

app = typer.Typer(
    name="peerd",
    help="Decentralized federated learning daemon (Cached-DFL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("demo")(demo.demo)


def main() -> None:
    app()
