"""A real, tiny tmpfs for full-disk tests (root only; the test is skipped elsewhere)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tiny_tmpfs(where: Path, size: str = "64k") -> Iterator[Path]:
    """Mount a ``size`` tmpfs at ``where`` (created), yield it, unmount it."""
    where.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(where)], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("mount is not available")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True, timeout=10, check=False)
