"""Fixtures for integration tests: throw-away namespace LANs (see netns.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from tests.integration.topology import Topology, topology
from tests.transport.netns import NetnsHost, netns_lan, skip_reason


@pytest.fixture
def lan() -> Iterator[Callable[[int], list[NetnsHost]]]:
    """``hosts = lan(3)``: n namespaces on one bridge, deleted at teardown (also on failure).

    Skipped, with the reason, where namespaces are unavailable (not root, no iproute2).
    """
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with ExitStack() as stack:
        yield lambda n: stack.enter_context(netns_lan(n))


@pytest.fixture
def net() -> Iterator[Topology]:
    """An empty :func:`tests.integration.topology.topology` (bridges and hosts added by the
    test), deleted at teardown; skipped, with the reason, where namespaces are unavailable."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with topology() as t:
        yield t
