"""Richer throw-away networks than one bridge: several bridges, multi-homed hosts, links that
go down and come back, partitions that heal.

All bridges live in one switch namespace; each host is a namespace whose interfaces are veth
pairs into that switch. Every veth pair is created with both ends moved out of the root
namespace in the same command, so nothing is ever added to (or visible from) the root
namespace. Every namespace is deleted on exit, also when the test fails or is interrupted;
deleting a namespace deletes the interfaces in it, so nothing is left behind.

    with topology() as net:
        net.bridge("left"); net.bridge("right")
        a = net.host("a", ("left", "10.78.1.1/24"))
        b = net.host("b", ("left", "10.78.1.2/24"), ("right", "10.78.2.2/24"))
        net.link_down(a)            # a's eth0 loses carrier
        net.move(a, "eth0", "right")  # re-plug a's cable into another bridge
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tests.net.netns import IP_CMD_TIMEOUT_S, NetnsHost


def _ip(*args: str, check: bool = True) -> None:
    done = subprocess.run(["ip", *args], check=False, capture_output=True,
                          timeout=IP_CMD_TIMEOUT_S)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.decode(errors='replace')}")


@dataclass
class Topology:
    tag: str
    switch: str
    created: list[str] = field(default_factory=list)  # namespaces, in creation order
    bridges: set[str] = field(default_factory=set)
    #: (host namespace, interface) -> the switch-side port of its veth pair
    ports: dict[tuple[str, str], str] = field(default_factory=dict)

    def bridge(self, name: str) -> None:
        _ip("-n", self.switch, "link", "add", name, "type", "bridge")
        _ip("-n", self.switch, "link", "set", name, "up")
        self.bridges.add(name)

    def host(self, name: str, *links: tuple[str, str]) -> NetnsHost:
        """A host namespace with one interface per ``(bridge, "IP/prefix")``: eth0, eth1, …

        The returned host's ``address`` is that of eth0.
        """
        ns = f"peerdt-{self.tag}-{name}"
        _ip("netns", "add", ns)
        self.created.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        for i, (bridge, cidr) in enumerate(links):
            ifname, port = f"eth{i}", f"v{self.tag}{len(self.ports)}"
            _ip("link", "add", port, "netns", self.switch, "type", "veth",
                "peer", "name", ifname, "netns", ns)
            _ip("-n", self.switch, "link", "set", port, "master", bridge, "up")
            _ip("-n", ns, "addr", "add", cidr, "dev", ifname)
            _ip("-n", ns, "link", "set", ifname, "up")
            self.ports[(ns, ifname)] = port
        return NetnsHost(ns, links[0][1].split("/")[0])

    def link_down(self, host: NetnsHost, ifname: str = "eth0") -> None:
        _ip("-n", host.name, "link", "set", ifname, "down")

    def link_up(self, host: NetnsHost, ifname: str = "eth0") -> None:
        _ip("-n", host.name, "link", "set", ifname, "up")

    def move(self, host: NetnsHost, ifname: str, bridge: str) -> None:
        """Re-plug ``host``'s interface into another bridge (the host sees no link change)."""
        _ip("-n", self.switch, "link", "set", self.ports[(host.name, ifname)], "master", bridge)


@contextmanager
def topology() -> Iterator[Topology]:
    tag = uuid.uuid4().hex[:6]
    net = Topology(tag, f"peerdt-{tag}-sw")
    try:
        _ip("netns", "add", net.switch)
        net.created.append(net.switch)
        yield net
    finally:
        for ns in reversed(net.created):
            _ip("netns", "del", ns, check=False)
