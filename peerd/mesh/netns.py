"""Throw-away LANs of Linux network namespaces (for `peerd demo` and the mesh tests).

``lan(n, net=77)`` builds a switch namespace holding bridge ``br0`` and ``n`` host
namespaces, each with ``lo`` and ``eth0`` (``10.<net>.0.<i+1>/24``: ``10.77.0.1`` and up by
default; the demo uses ``net=78``) wired to the bridge by a veth pair, and deletes every
namespace on exit, also on errors or Ctrl-C. Nothing is added to the root namespace (both
veth ends move out at once), so multicast DNS stays inside the bridge: this is how several
daemons on one machine can discover each other without touching the real LAN. Needs root
and iproute2; :func:`unavailable` says why not. It owns namespaces and links only: what
runs inside them is the caller's (:mod:`peerd.mesh.localmesh`, the tests).
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

#: Every ip(8) call is local and instant; a hung one means a broken kernel or iproute2.
IP_CMD_TIMEOUT_S = 10.0


def _ip(*args: str, check: bool = True) -> None:
    # iproute2 from PATH with arguments we build ourselves (no user input reaches them).
    subprocess.run(["ip", *args], check=check, capture_output=True,  # noqa: S603, S607
                   timeout=IP_CMD_TIMEOUT_S)


def unavailable() -> str | None:
    """Why namespaces cannot be used here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = f"peerd-probe-{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        return f"cannot create network namespaces here: {exc}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    name: str  # namespace name
    address: str  # IPv4 address of eth0

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside this namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def python(self, *args: str) -> list[str]:
        """This interpreter, with ``args``, inside this namespace."""
        return self.command([sys.executable, *args])


@contextmanager
def lan(n: int, *, net: int = 77, prefix: str = "peerd") -> Iterator[list[Host]]:
    tag = uuid.uuid4().hex[:6]
    switch = f"{prefix}-{tag}-sw"
    hosts = [Host(f"{prefix}-{tag}-h{i}", f"10.{net}.0.{i + 1}") for i in range(n)]
    created: list[str] = []
    try:
        _ip("netns", "add", switch)
        created.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for i, h in enumerate(hosts):
            _ip("netns", "add", h.name)
            created.append(h.name)
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
