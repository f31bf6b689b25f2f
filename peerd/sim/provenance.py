"""Provenance of a simulator run: which code ran it, with what command, where, when, how long.

A result a referee can check names the code that produced it (issue 28). Every output file of
``peerd sim`` (the grid run, ``fedcache``, ``cordial``, ``fedcvt --out``) carries the record
made here: the commit and whether the tree was dirty when the run *started* (its own outputs
may dirty it afterwards), the full command with every default spelled out (a changed default
can then never silently change what a recorded command means), the resolved options, the
machine (cores, CPU model, torch threads), the start date and the wall time.

The commit is read only where peerd runs from a git checkout of its source (an editable
install); from a wheel it is ``None`` and the installed version says what ran. The benchmarks'
own records (``benchmarks/_provenance.py``) share the machine and git readings below.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

#: The source tree peerd was imported from (a checkout's root when installed editable).
SOURCE_ROOT = Path(__file__).resolve().parents[2]
#: At most this many changed paths are listed with ``dirty`` (the flag says the rest).
MAX_DIRTY_PATHS = 20
#: A hung git (a locked index on a network disk) must not hold a run's start.
GIT_TIMEOUT_S = 10.0


def git(root: Path, *argv: str) -> str:
    """``git -C root ARGV``'s stdout; raises ``OSError``/``CalledProcessError`` when it fails."""
    # git from PATH, fixed read-only subcommands: what a developer's shell would run
    return subprocess.run(["git", "-C", str(root), *argv], capture_output=True,  # noqa: S603, S607
                          text=True,
                          check=True, timeout=GIT_TIMEOUT_S).stdout


@dataclass(frozen=True)
class GitState:
    commit: str | None  # None: not a checkout (a wheel install), or git missing
    dirty: bool
    dirty_paths: tuple[str, ...]


def git_state(root: Path = SOURCE_ROOT) -> GitState:
    """The checkout's commit and dirty state; ``commit=None`` when ``root`` is no checkout
    of its own (a wheel's site-packages lies inside no repository, or inside another's)."""
    try:
        top = Path(git(root, "rev-parse", "--show-toplevel").strip()).resolve()
        if top != root.resolve():
            return GitState(None, False, ())
        commit = git(root, "rev-parse", "HEAD").strip()
        status = [line[3:] for line in git(root, "status", "--porcelain").splitlines() if line]
    except (OSError, subprocess.SubprocessError):
        return GitState(None, False, ())
    return GitState(commit, bool(status), tuple(status[:MAX_DIRTY_PATHS]))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """Cores, CPU, thread count and versions; imports torch, so call it after measuring."""
    import torch

    return {"cores": os.cpu_count(), "cpu": cpu_model(), "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "torch": torch.__version__,
            # How busy the machine was (1, 5, 15 min) as the run ended: a shared machine's
            # absolute times move with it, so a reader can tell a loaded run from a quiet one.
            "load_avg": [round(x, 2) for x in os.getloadavg()]}


def peerd_version() -> str | None:
    try:
        return metadata.version("peerd")
    except metadata.PackageNotFoundError:
        return None


def jsonable(value: Any) -> Any:
    """An option's value as JSON: scalars as they are, sequences item by item, the rest
    (paths, enums) as the command line spells them."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return str(value)


@dataclass(frozen=True)
class Started:
    """A run's provenance as far as it is known at its start."""

    git: GitState
    command: tuple[str, ...]
    args: dict[str, Any]
    date: str
    t0: float

    def record(self) -> dict[str, Any]:
        """The JSON-able provenance, with the machine and the wall time so far."""
        return {
            "commit": self.git.commit,
            "dirty": self.git.dirty,
            "dirty_paths": list(self.git.dirty_paths),
            "peerd_version": peerd_version(),
            "command": list(self.command),
            "command_line": shlex.join(self.command),
            "args": self.args,
            "machine": machine(),
            "date": self.date,
            "wall_s": round(time.perf_counter() - self.t0, 1),
        }


def start(command: list[str], args: dict[str, Any]) -> Started:
    """Take the commit, the dirty state, the command and the clock now."""
    return Started(git=git_state(), command=tuple(command),
                   args={k: jsonable(v) for k, v in sorted(args.items())},
                   date=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                   t0=time.perf_counter())
