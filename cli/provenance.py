"""The command as run, every option spelled out, for the provenance of a simulator output.

A recorded command must mean the same run after a default changes, so it is rebuilt from the
resolved options (what the user typed and every default click filled in), not copied from
``sys.argv``. The record itself is :mod:`peerd.sim.provenance`'s; this module knows click.
"""

from __future__ import annotations

from typing import Any

import typer

from peerd.sim.provenance import Started, jsonable, start


def expanded_command(ctx: typer.Context, resolved: dict[str, Any] | None = None) -> list[str]:
    """``peerd sim … --opt value …`` with every option of ``ctx``'s command and its value.

    ``resolved`` overrides values the command settled itself (an old spelling read into its
    new name); hidden options (those old spellings) are never written. A boolean flag appears
    when on (its off spelling when it has one and is off); an option whose value is ``None``
    (an unset optional) is left out, since leaving it out gives ``None`` again."""
    params = {**ctx.params, **(resolved or {})}
    words = ["peerd", *ctx.command_path.split()[1:]]
    for param in ctx.command.params:
        if param.name is None or param.name not in params or getattr(param, "hidden", False):
            continue
        value = params[param.name]
        opts = getattr(param, "opts", [])
        if getattr(param, "is_flag", False):
            if value:
                words.append(opts[0])
            elif getattr(param, "secondary_opts", []):
                words.append(param.secondary_opts[0])
            continue
        if value is None:
            continue
        spelled = [str(v) for v in jsonable(value)] if isinstance(value, list | tuple) else [
            str(jsonable(value))]
        if not opts or not opts[0].startswith("-"):  # an argument
            words += spelled
        else:
            for v in spelled:
                words += [opts[0], v]
    return words


def started(ctx: typer.Context, **resolved: Any) -> Started:
    """The run's provenance at its start; ``resolved`` as for :func:`expanded_command`."""
    hidden = {p.name for p in ctx.command.params if getattr(p, "hidden", False)}
    args = {k: v for k, v in {**ctx.params, **resolved}.items() if k not in hidden}
    return start(expanded_command(ctx, resolved), args)
