"""Shared test settings: one torch thread (the machine has 2 cores shared by many tests)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from peerd.mesh.netns import Host, unavailable
from tests.net.netns import netns_lan

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


@pytest.fixture
def lan() -> Iterator[Callable[[int], list[Host]]]:
    """``hosts = lan(3)``: n namespaces on one private bridge, deleted at teardown (also on
    failure). Skipped, with the reason, where namespaces are unavailable (not root, no ip)."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with ExitStack() as stack:
        yield lambda n: stack.enter_context(netns_lan(n))


#: Seconds one recv on the notify socket waits (callers loop for longer waits).
NOTIFY_RECV_TIMEOUT_S = 2.0


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """The datagram socket systemd would provide; ``$NOTIFY_SOCKET`` names it (daemons
    started by a test inherit the test's environment)."""
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(NOTIFY_RECV_TIMEOUT_S)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield sock
    sock.close()
