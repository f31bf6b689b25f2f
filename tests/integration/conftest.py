"""Fixtures for integration tests: multi-bridge topologies (``lan`` is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.topology import Topology, topology
from tests.net.netns import skip_reason


@pytest.fixture
def net() -> Iterator[Topology]:
    """An empty :func:`tests.integration.topology.topology` (bridges and hosts added by the
    test), deleted at teardown; skipped, with the reason, where namespaces are unavailable."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with topology() as t:
        yield t
