"""Throw-away LANs of network namespaces for tests (see :mod:`peerd.mesh.netns`, which builds them).

``netns_lan(n)`` yields ``n`` hosts (10.77.0.<i+1>/24 on ``eth0``) on one private bridge and
deletes every namespace on exit, also when the test fails; ``skip_reason()`` says why
namespaces are unavailable (not root, no iproute2), for ``pytest.skip``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from peerd.mesh.netns import IP_CMD_TIMEOUT_S, Host, unavailable
from peerd.mesh.netns import lan as _lan

__all__ = ["IP_CMD_TIMEOUT_S", "SUBNET", "NetnsHost", "netns_lan", "skip_reason"]

NetnsHost = Host
SUBNET = "10.77.0"
skip_reason = unavailable


@contextmanager
def netns_lan(n: int) -> Iterator[list[Host]]:
    with _lan(n, net=77, prefix="peerdt") as hosts:
        yield hosts
