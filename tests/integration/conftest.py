"""Fixtures for integration tests: the daemons a test started, stopped at teardown, and
multi-bridge topologies (``lan`` is in tests/conftest.py)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.integration.mesh import Node
from tests.integration.topology import Topology, topology
from tests.net.netns import skip_reason


@pytest.fixture
def running() -> Iterator[list[Node]]:
    """Nodes appended here are stopped at teardown: SIGTERM to all first, then wait, so a
    six-node test does not pay six shutdowns in a row. Request it after ``lan``/``net`` so
    daemons stop before their namespaces are deleted."""
    started: list[Node] = []
    yield started
    for node in started:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
    for node in started:
        node.stop()


@pytest.fixture
def net() -> Iterator[Topology]:
    """An empty :func:`tests.integration.topology.topology` (bridges and hosts added by the
    test), deleted at teardown; skipped, with the reason, where namespaces are unavailable."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with topology() as t:
        yield t
