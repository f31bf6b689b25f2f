"""The command line's conventions, applied to every command at once.

Typer renders every option's type as ``<bool>``, ``<path>``, ``<int range>`` and a required
argument as ``{file}`` in the usage line. An operator reads POSIX-style help: flags with no
value shown, values as ``PATH``, ``INTEGER``, ``NODE_ID``, arguments in capitals, optional
ones in brackets. Rather than repeat a metavar on every declaration (and miss the next
one), :class:`ConventionalGroup` is the root group's class: when typer builds the command
tree it rewrites the display of every parameter below it, commands added later included.
An explicit ``metavar=`` on a declaration still wins.

Owns only how parameters and help text are *shown*; parsing, defaults and validation stay typer's.
``tests/cli/test_cli_conventions.py`` walks every command's ``--help`` to keep it so.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

from typer import _click
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

#: What typer calls a type -> the conventional metavar (unlisted types: upper-cased).
_TYPE_METAVARS = {
    "path": "PATH",
    "int": "INTEGER",
    "int range": "INTEGER",
    "float": "NUMBER",
    "float range": "NUMBER",
    "str": "TEXT",
}
_TYPER_TYPE = re.compile(r"^<(?P<label>[^>]*)>(?P<more>(\.\.\.)?)$")


def conventional_metavar(typer_label: str) -> str:
    """``"<path>"`` -> ``"PATH"``, ``"<a|b>"`` -> ``"[a|b]"`` (choices keep their spelling)."""
    match = _TYPER_TYPE.match(typer_label)
    if match is None:
        return typer_label
    label, more = match["label"], match["more"]
    if "|" in label:
        return f"[{label}]{more}"
    return _TYPE_METAVARS.get(label, label.upper().replace(" ", "_")) + more


class _Option(TyperOption):
    """An option shown as ``--state-dir PATH``; a flag shows no value at all."""

    def display_type_rich(self, ctx: _click.Context) -> str | None:
        if self.metavar is not None:
            return self.metavar
        if self.is_flag or self.count:
            return None
        shown = super().display_type_rich(ctx)
        return None if shown is None else conventional_metavar(shown)


class _Argument(TyperArgument):
    """An argument named in capitals (``NODE_ID``), bare when required, ``[NAME]`` if not."""

    def display_type_rich(self, ctx: _click.Context) -> str | None:
        return None  # the name column already is the metavar

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")


def _commands(command: _click.Command) -> Iterator[_click.Command]:
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from _commands(sub)


def _conventional_param(param: _click.Parameter) -> None:
    # Same object, a subclass that only overrides display methods: typer builds the
    # parameters itself and offers no hook to choose their class.
    if type(param) is TyperOption:
        param.__class__ = _Option
    elif type(param) is TyperArgument:
        param.__class__ = _Argument
        if param.metavar is None and param.name is not None:
            param.metavar = param.name.upper()


def _help_option(option: TyperOption | None) -> TyperOption | None:
    # The help option is made lazily, per command, after the tree was built: convert it then.
    if option is not None:
        _conventional_param(option)
    return option


class _Command(TyperCommand):
    def get_help_option(self, ctx: _click.Context) -> TyperOption | None:
        return _help_option(super().get_help_option(ctx))


class _Group(TyperGroup):
    def get_help_option(self, ctx: _click.Context) -> TyperOption | None:
        return _help_option(super().get_help_option(ctx))


def reflow(help_text: str | None) -> str | None:
    """A docstring's paragraphs as single lines. Typer (0.29) keeps the source's line breaks
    inside every paragraph after the first, so a wrapped docstring showed as ragged lines
    ("... a peer that" / "failed ..."); the terminal wraps a single line itself. Paragraphs
    that start with ``\b`` (click's "keep as is") are left alone."""
    if not help_text:
        return help_text
    paragraphs = inspect.cleandoc(help_text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split("\n"))
                       for p in paragraphs)


def apply_conventions(command: _click.Command) -> None:
    """Rewrite how ``command`` and every command below it show their parameters and help."""
    for cmd in _commands(command):
        if type(cmd) is TyperCommand:
            cmd.__class__ = _Command
        elif type(cmd) is TyperGroup:
            cmd.__class__ = _Group
        cmd.help = reflow(cmd.help)
        for param in cmd.params:
            _conventional_param(param)


class ConventionalGroup(_Group):
    """The root group (``typer.Typer(cls=ConventionalGroup)``): conventions for all below."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        apply_conventions(self)


def walk(command: _click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The argv prefix of every command under ``command`` (``()`` for the root itself)."""
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from walk(sub, (*path, name))
