"""The installed package holds every package of the tree: pyproject.toml lists its packages
by hand (protocol/ and cli/ install as peerd.protocol and peerd.cli), so a new folder left
out of the list imports from a checkout and fails after ``pip install`` (it happened to
peerd.daemon.modes; tests/cli/test_installed_demos.py caught it from a real install)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = {"peerd": "peerd", "protocol": "peerd.protocol", "cli": "peerd.cli"}


def _packages_on_disk() -> dict[str, str]:
    """Import name -> folder (relative to the root) of every folder with an __init__.py."""
    out: dict[str, str] = {}
    for top, name in TOP.items():
        for init in sorted((ROOT / top).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / top)
            dotted = ".".join((name, *rel.parts)) if rel.parts else name
            out[dotted] = init.parent.relative_to(ROOT).as_posix()
    return out


def test_every_package_folder_is_installed_under_its_name() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = _packages_on_disk()
    assert sorted(setuptools["packages"]) == sorted(on_disk)
    assert setuptools["package-dir"] == on_disk
