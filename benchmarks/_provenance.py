"""Provenance of a benchmark's output: what ran, on which code, where, when, for how long.

Every benchmark that writes a committed output records :meth:`Started.record` beside its
numbers (issue 28): the commit and whether the tree was dirty when the run *started* (the run's
own outputs make it dirty afterwards), the full command with every argparse default expanded
(so a changed default can never silently change what a recorded command means), the machine
(cores, CPU model, torch threads), the start date and the wall time.

    started = _provenance.start(parser, args)   # right after parse_args
    ...                                          # the measurements
    result["provenance"] = started.record()      # when the numbers are in

Nothing here imports torch until :meth:`Started.record`, after the measurements: a benchmark
of import cost or memory is not disturbed by its own bookkeeping.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# The record itself (and its machine and git readings) is the simulator's, shared.
from peerd.sim.provenance import MAX_DIRTY_PATHS, GitState, git, jsonable
from peerd.sim.provenance import Started as Started  # what benchmarks annotate with

ROOT = Path(__file__).resolve().parent.parent


def expanded_argv(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The options that give ``args`` under ``parser``, every one spelled out, defaults
    included. A flag whose value is ``None`` (an unset optional) is left out: argparse has no
    spelling for it, and leaving it out gives ``None`` again. Raises ``ValueError`` for an
    action it cannot spell (subcommands, custom actions) or a command that does not parse
    back to ``args``, rather than record a wrong one."""
    out: list[str] = []
    positionals: list[str] = []
    for action in parser._actions:  # argparse has no public list of actions
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        if action.dest is argparse.SUPPRESS or not hasattr(args, action.dest):
            continue
        value = getattr(args, action.dest)
        flag = action.option_strings[-1] if action.option_strings else None
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            if value == action.const and flag is not None:
                out.append(flag)
            continue
        if isinstance(action, argparse._StoreConstAction):
            if value == action.const and flag is not None:
                out.append(flag)
            continue
        if type(action) is not argparse._StoreAction:
            raise ValueError(f"cannot spell argparse action {type(action).__name__} "
                             f"({action.dest}) in a recorded command")
        if value is None:
            continue
        if not isinstance(value, list | tuple):
            words = [str(value)]
        elif action.nargs in (None, "?"):
            words = [",".join(str(v) for v in value)]  # a `type` that parses a comma list
        else:
            words = [str(v) for v in value]
        if flag is None:
            positionals += words
        else:
            out += [flag, *words]
    argv = positionals + out  # first: an nargs="+" option would swallow them at the end
    if _reparsed(parser, argv) != args:
        raise ValueError(f"the expanded command {argv} does not give the same arguments")
    return argv


def _reparsed(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | None:
    try:
        return parser.parse_args(argv)
    except SystemExit:  # argparse's way of refusing (it printed why on stderr)
        return None


def _entry() -> list[str]:
    """How this process was started: ``python -m MODULE`` or ``python SCRIPT``."""
    exe = Path(sys.executable)
    try:
        python = str(exe.relative_to(ROOT))  # ".venv/bin/python": what the docs write
    except ValueError:
        python = str(exe)
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        return [python, "-m", spec.name.removesuffix(".__main__")]
    return [python, sys.argv[0]]


def _git(*argv: str) -> str:
    return git(ROOT, *argv)


def start(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Started:
    """Take the commit, the dirty state, the expanded command and the clock now. Unlike a
    simulator run's, a benchmark's record must name a commit: it runs from the checkout."""
    status = [line[3:] for line in _git("status", "--porcelain").splitlines() if line]
    return Started(
        git=GitState(commit=_git("rev-parse", "HEAD").strip(), dirty=bool(status),
                     dirty_paths=tuple(status[:MAX_DIRTY_PATHS])),
        command=tuple(_entry() + expanded_argv(parser, args)),
        args={k: jsonable(v) for k, v in sorted(vars(args).items())},
        date=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        t0=time.perf_counter(),
    )


def line(record: dict[str, Any]) -> str:
    """One Markdown line for a section that carries the record (commit, command, machine)."""
    m = record["machine"]
    state = _state(record)
    return (f"Provenance: commit `{record['commit'][:12]}` ({state}), "
            f"`{record['command_line']}`; {m['cpu']}, {m['cores']} cores, torch "
            f"{m['torch_threads']} threads{_load(m)}; {record['date']}, {record['wall_s']} s "
            "wall.")


def _state(record: dict[str, Any]) -> str:
    """clean, dirty, or what was dirty when only outputs under docs/ were (a run writing into a
    folder that earlier runs of the same campaign had filled: the code was the commit's)."""
    if not record["dirty"]:
        return "clean"
    paths = record.get("dirty_paths") or []
    if paths and len(paths) <= 3 and all(p.startswith("docs/") for p in paths):
        return f"dirty only in {', '.join(f'`{p}`' for p in paths)}"
    return "dirty"


def _load(m: dict[str, Any]) -> str:
    # Records made before the load was recorded say nothing about it.
    return f", load average {m['load_avg'][0]:.2f} at the end" if "load_avg" in m else ""
