"""Every command's help follows the conventions of cli/conventions.py (walked, not listed)."""

from __future__ import annotations

import re
from importlib.metadata import version

import pytest
import typer.main
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.cli.conventions import conventional_metavar, reflow, walk

runner = CliRunner(env={"COLUMNS": "120"})
ROOT = typer.main.get_command(app)
COMMANDS = list(walk(ROOT))


def _help(path: tuple[str, ...], flag: str = "--help") -> str:
    result = runner.invoke(app, [*path, flag])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(p) for p in COMMANDS}
    assert {"", "run", "status", "export", "fleet", "fleet show", "fleet admit",
            "flags clear", "demo", "init", "keygen", "peers", "sim"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "peerd")
def test_help_shows_no_typer_type_tags_and_a_plain_usage_line(path: tuple[str, ...]) -> None:
    text = _help(path)
    assert "<bool>" not in text
    # No typer type tags at all (<path>, <int range>, <str>): PATH, INTEGER, TEXT instead.
    assert re.search(r"<[a-z][a-z ]*>", text) is None, text
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    assert "{" not in usage, usage  # typer writes a required argument as {name}
    assert re.search(r"\b[a-z_]+\b(?=\s*$)", usage.split("[OPTIONS]")[-1]) is None, usage


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "peerd")
def test_dash_h_is_help_everywhere(path: tuple[str, ...]) -> None:
    assert _help(path, "-h") == _help(path, "--help")


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "peerd")
def test_every_config_option_has_dash_c(path: tuple[str, ...]) -> None:
    command = ROOT
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    for param in command.params:
        if "--config" in getattr(param, "opts", []):
            assert "-c" in param.opts, f"peerd {' '.join(path)}: --config without -c"


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "peerd")
def test_help_paragraphs_are_single_lines_the_terminal_wraps(path: tuple[str, ...]) -> None:
    command = ROOT
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    for paragraph in (command.help or "").split("\n\n"):
        assert paragraph.startswith("\b") or "\n" not in paragraph, paragraph


def test_reflow_joins_lines_within_paragraphs_only() -> None:
    doc = """First line
    goes on.

    Second paragraph,
    wrapped.

    \b
    kept
    as is"""
    assert reflow(doc) == "First line goes on.\n\nSecond paragraph, wrapped.\n\n\b\nkept\nas is"


def test_version_prints_the_installed_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"peerd {version('peerd')}"


def test_node_ids_and_directories_have_meaningful_metavars() -> None:
    assert "NODE_ID" in _help(("fleet", "admit"))
    assert "--fleet       DIR" in _help(("fleet", "admit")) or "--fleet DIR" in " ".join(
        _help(("fleet", "admit")).split())
    assert "--config -c FILE" in " ".join(_help(("status",)).split())


@pytest.mark.parametrize(("typer_label", "shown"), [
    ("<path>", "PATH"), ("<int range>", "INTEGER"), ("<float>", "NUMBER"), ("<str>", "TEXT"),
    ("<digits|mnist>", "[digits|mnist]"), ("<path>...", "PATH..."), ("FILE", "FILE"),
])
def test_conventional_metavar(typer_label: str, shown: str) -> None:
    assert conventional_metavar(typer_label) == shown
