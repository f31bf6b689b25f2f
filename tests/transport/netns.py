"""Throw-away LANs of network namespaces for tests that must not touch the real network.

``netns_lan(n)`` builds a switch namespace holding bridge ``br0`` and ``n`` host namespaces,
each with ``lo`` and ``eth0`` (10.77.0.<i+1>/24) wired to the bridge by a veth pair; it
yields the hosts and deletes every namespace on exit, also when the test fails. Multicast
(mDNS) works across the bridge with no sysctl. Needs root and iproute2; ``skip_reason()``
says why not, for ``pytest.skip``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

#: Every ip(8) call is local and instant; a hung one means a broken kernel/iproute2.
IP_CMD_TIMEOUT_S = 10.0
SUBNET = "10.77.0"


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = f"peerdt-probe-{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        return f"cannot create network namespaces here: {e}"
    _ip("netns", "del", probe, check=False)
    return None


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(
        ["ip", *args], check=check, capture_output=True, timeout=IP_CMD_TIMEOUT_S
    )


@dataclass(frozen=True)
class NetnsHost:
    name: str  # namespace name
    address: str  # IPv4 address of eth0

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside this namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def python(self, *args: str) -> list[str]:
        return self.command([sys.executable, *args])


@contextmanager
def netns_lan(n: int) -> Iterator[list[NetnsHost]]:
    tag = uuid.uuid4().hex[:6]
    switch = f"peerdt-{tag}-sw"
    hosts = [NetnsHost(f"peerdt-{tag}-h{i}", f"{SUBNET}.{i + 1}") for i in range(n)]
    created: list[str] = []
    try:
        _ip("netns", "add", switch)
        created.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for i, h in enumerate(hosts):
            _ip("netns", "add", h.name)
            created.append(h.name)
            # Created in the root namespace but both ends moved out at once: nothing of
            # it stays in (or is visible from) the root namespace.
            _ip("link", "add", f"v{tag}{i}", "netns", switch, "type", "veth",
                "peer", "name", "eth0", "netns", h.name)
            _ip("-n", switch, "link", "set", f"v{tag}{i}", "master", "br0", "up")
            _ip("-n", h.name, "link", "set", "lo", "up")
            _ip("-n", h.name, "addr", "add", f"{h.address}/24", "dev", "eth0")
            _ip("-n", h.name, "link", "set", "eth0", "up")
        yield hosts
    finally:
        for name in reversed(created):
            _ip("netns", "del", name, check=False)
