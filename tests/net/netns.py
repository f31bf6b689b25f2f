"""Throw-away LANs of network namespaces for tests (see :mod:`peerd.mesh.netns`, which builds them).

``netns_lan(n)`` yields ``n`` hosts (10.77.0.<i+1>/24 on ``eth0``) on one private bridge and
deletes every namespace on exit, also when the test fails; ``skip_reason()`` says why
namespaces are unavailable (not root, no iproute2), for ``pytest.skip``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from peerd.mesh.netns import IP_CMD_TIMEOUT_S, Host, unavailable
from peerd.mesh.netns import lan as _lan

__all__ = ["IP_CMD_TIMEOUT_S", "SUBNET", "NetnsHost", "netns_lan", "replace_address",
           "skip_reason"]

NetnsHost = Host
SUBNET = "10.77.0"
skip_reason = unavailable


@contextmanager
def netns_lan(n: int) -> Iterator[list[Host]]:
    with _lan(n, net=77, prefix="peerdt") as hosts:
        yield hosts


def replace_address(h: Host, new: str) -> None:
    """Move ``h`` from its address to ``new`` on ``eth0`` (a DHCP renewal, a move to another
    network): ``new`` is added and promoted when the old one is deleted (without
    promote_secondaries Linux deletes a subnet's secondaries along with its primary)."""
    subprocess.run(h.command(["sh", "-c",
                              "echo 1 > /proc/sys/net/ipv4/conf/eth0/promote_secondaries"]),
                   check=True, timeout=IP_CMD_TIMEOUT_S)
    for args in (("add", f"{new}/24"), ("del", f"{h.address}/24")):
        subprocess.run(["ip", "-n", h.name, "addr", *args, "dev", "eth0"], check=True,
                       capture_output=True, timeout=IP_CMD_TIMEOUT_S)
