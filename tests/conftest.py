"""Shared test settings: one torch thread (the machine has 2 cores shared by many tests)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # protocol tests must not need torch
    pass


def pytest_configure(config: pytest.Config) -> None:
    # Registered here rather than in pyproject.toml; the marker does not deselect anything:
    # integration tests run in the default test command too (`-m "not integration"` skips).
    config.addinivalue_line(
        "markers", "integration: slow multi-process scenario tests (real daemons, namespaces)"
    )
