"""A throw-away WAN of network namespaces for tests (issue 27, item 4): sites behind NAT routers
and a "public" segment, built beside :mod:`peerd.mesh.netns`'s one-bridge LANs.

``wan(site_hosts=(2, 2), public_hosts=1)`` builds

- a public switch namespace (bridge ``br0``, 203.0.113.0/24, TEST-NET-3) holding the public
  hosts (``203.0.113.<10+i>``) and each router's uplink;
- per site (``a``, ``b``) a router namespace (``wan0`` = ``203.0.113.<2+k>`` on the public
  bridge, ``lan0`` = ``10.<net>.<k+1>.1``) and a site switch namespace whose bridge holds the
  site's hosts (``10.<net>.<k+1>.<i+2>``, default route via the router).

Each router forwards (``ip_forward`` is on there only) and masquerades what leaves ``wan0``:
site ``a`` plainly (Linux keeps a flow's source port when it is free, so one socket keeps one
public port towards every destination: endpoint-independent mapping), site ``b`` with
``--random-fully`` (a random port per flow: symmetric-ish). Like a home router it drops what
arrives on ``wan0`` unless it belongs to a flow started from inside. ``Link`` shapes each uplink
(see there; no ``sch_netem`` needed: a delay is a userspace delay line between two TAP
devices, tests/net/delaywire.py, run in the router's namespace); :func:`cut` takes an uplink
down for a while, as a failing line does. Every namespace is deleted, and every delay line
stopped, on exit, also when the test fails; nothing is added to the root namespace (no mDNS
leaves it).
Both iptables back ends (nft, legacy) work inside a namespace; ``iptables`` is whichever the
system's alternative names. ``skip_reason(link)`` says why this cannot run here;
``wan_or_skip(...)``, a test's fixture body, is ``wan(...)`` or the test skipped with it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from peerd.mesh.netns import IP_CMD_TIMEOUT_S, Host, unavailable

__all__ = ["PUBLIC_SUBNET", "Link", "Site", "Wan", "cut", "drop_unsolicited", "punchable",
           "skip_reason", "wan", "wan_or_skip"]

PUBLIC_SUBNET = "203.0.113"
#: Site ``a`` keeps a flow's port (endpoint-independent), ``b`` randomises it per flow.
NAT_FLAGS = {"a": (), "b": ("--random-fully",)}
WIRE = Path(__file__).with_name("delaywire.py")


@dataclass(frozen=True)
class Link:
    """Shaping of each router's uplink, in both directions (so an RTT gains 2 × delay).

    A rate is a tbf at both ends of the uplink; loss is an iptables ``statistic`` DROP in the
    router's FORWARD chain, one rule each way, so each direction loses ``loss_pct`` of its
    packets. A delay is a userspace delay line (tests/net/delaywire.py): the uplink is then a
    pair of TAP devices, not a veth pair, with a process in the router's namespace copying
    frames between them ``delay_ms`` late each way; tbf shapes the TAPs and the router
    drops as before. None of it needs ``sch_netem`` (which many CI and distribution kernels,
    and this machine's, lack), so one link is the same link on every kernel; a delay needs
    ``/dev/net/tun`` (:func:`skip_reason`)."""

    delay_ms: float = 0.0
    rate_mbit: float | None = None
    loss_pct: float = 0.0

    @property
    def needs_tun(self) -> bool:
        return self.delay_ms > 0

    def qdisc(self) -> list[str] | None:
        """The uplink's ``tc qdisc`` (both ends), or None when it needs none."""
        if self.rate_mbit is None:
            return None
        # burst: a few MTU-sized packets, so the rate holds over short transfers too.
        return ["tbf", "rate", f"{self.rate_mbit}mbit", "burst", "16kb", "latency", "400ms"]

    def drop_rules(self) -> list[list[str]]:
        """The router's FORWARD rules (to insert first) that lose ``loss_pct`` each way."""
        if self.loss_pct <= 0:
            return []
        stat = ["-m", "statistic", "--mode", "random", "--probability",
                f"{self.loss_pct / 100:.6f}", "-j", "DROP"]
        return [[side, "wan0", *stat] for side in ("-i", "-o")]


@dataclass(frozen=True)
class Site:
    name: str  # "a" or "b"
    router: Host  # router namespace; .address is its public (wan0) address
    lan_address: str  # the router's address on the site bridge
    hosts: list[Host]
    random_fully: bool


@dataclass(frozen=True)
class Wan:
    public: list[Host]
    sites: dict[str, Site]
    #: The delay lines' processes (tests/net/delaywire.py), one per delayed uplink.
    wire_pids: tuple[int, ...] = ()


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True,
                          timeout=IP_CMD_TIMEOUT_S)


def _ip(*args: str, check: bool = True) -> None:
    _run(["ip", *args], check=check)


@cache
def _tun_missing() -> str | None:
    probe = f"peerd-tprobe-{uuid.uuid4().hex[:6]}"
    _ip("netns", "add", probe)
    try:
        got = _run(["ip", "netns", "exec", probe, "ip", "tuntap", "add", "dev", "tap0",
                    "mode", "tap"], check=False)
        return None if got.returncode == 0 else \
            f"TAP devices are unavailable (a delay needs /dev/net/tun): {got.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)


def skip_reason(link: Link | None = None) -> str | None:
    """Why this WAN cannot be built here (with ``link``'s shaping), or None if it can."""
    for tool in ("ip", "iptables", "tc", "conntrack"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (scripts/setup installs it as root)"
    reason = unavailable()
    if reason is None and link is not None and link.needs_tun:
        reason = _tun_missing()
    return reason


def _wire(router: str, pub_sw: str, port: str, delay_ms: float) -> subprocess.Popen[str]:
    """Start the uplink's delay line: ``wan0`` in ``router``, ``port`` in ``pub_sw``."""
    p = subprocess.Popen(["ip", "netns", "exec", router, sys.executable, str(WIRE),
                          str(delay_ms), "wan0", port, pub_sw],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    if p.stdout.readline().strip() != "ready":
        _stop(p)
        raise RuntimeError(f"the delay line for {router} did not start (exit {p.returncode})")
    return p


def _stop(p: subprocess.Popen[str]) -> None:
    """End a delay line: its stdin closes (it exits on EOF), else it is killed."""
    if p.stdin is not None:
        p.stdin.close()
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def _shape(ns: str, dev: str, link: Link | None) -> None:
    qdisc = link.qdisc() if link is not None else None
    if qdisc is not None:
        _ip("-n", ns, "link", "set", dev, "up")
        _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", *qdisc])


@contextmanager
def cut(site: Site) -> Iterator[None]:
    """The site's uplink carries nothing while inside (every forwarded packet dropped, both
    ways, as a failed line or a dead modem does; the hosts' connections see only silence),
    and carries again after. The rule goes first, ahead of the NAT's and the loss rules."""
    rt = ["ip", "netns", "exec", site.router.name, "iptables"]
    rule = ["FORWARD", "-j", "DROP"]
    _run([*rt, "-I", *rule])
    try:
        yield
    finally:
        _run([*rt, "-D", *rule])


@contextmanager
def wan(site_hosts: tuple[int, int] = (2, 2), public_hosts: int = 1, *, net: int = 79,
        link: Link | None = None, prefix: str = "peerdw") -> Iterator[Wan]:
    tag = uuid.uuid4().hex[:6]
    created: list[str] = []
    wires: list[subprocess.Popen[str]] = []

    def ns(name: str) -> str:
        full = f"{prefix}-{tag}-{name}"
        _ip("netns", "add", full)
        created.append(full)
        _ip("-n", full, "link", "set", "lo", "up")
        return full

    def bridge(name: str) -> str:
        sw = ns(name)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        return sw

    def plug(sw: str, port: str, host: str, dev: str, cidr: str, delay_ms: float = 0) -> None:
        # Both ends are created inside their namespaces: nothing touches the root namespace.
        if delay_ms > 0:  # a TAP pair and the delay line between them, not a veth pair
            wires.append(_wire(host, sw, port, delay_ms))
        else:
            _ip("link", "add", port, "netns", sw, "type", "veth", "peer", "name", dev,
                "netns", host)
        _ip("-n", sw, "link", "set", port, "master", "br0", "up")
        _ip("-n", host, "addr", "add", cidr, "dev", dev)
        if link is not None and link.loss_pct > 0:
            # One wire packet per skb: a TCP sender's skb is otherwise a TSO aggregate of
            # up to 64 kB that crosses veths and the router whole, so the router's rule
            # would lose 1 % of aggregates (measured: ~0.3 % of wire packets), not 1 % of
            # packets. (The routers' own devices do no GRO: what they see is per packet.)
            _ip("-n", host, "link", "set", dev, "gso_max_segs", "1")
        _ip("-n", host, "link", "set", dev, "up")

    try:
        pub_sw = bridge("pub")
        public = []
        for i in range(public_hosts):
            h = Host(ns(f"p{i}"), f"{PUBLIC_SUBNET}.{10 + i}")
            plug(pub_sw, f"p{tag}{i}", h.name, "eth0", f"{h.address}/24")
            public.append(h)
        sites = {}
        for k, (name, n) in enumerate(zip("ab", site_hosts, strict=True)):
            router = Host(ns(f"{name}r"), f"{PUBLIC_SUBNET}.{2 + k}")
            plug(pub_sw, f"u{tag}{name}", router.name, "wan0", f"{router.address}/24",
                 link.delay_ms if link is not None else 0)
            _shape(router.name, "wan0", link)
            _shape(pub_sw, f"u{tag}{name}", link)
            site_sw = bridge(f"{name}s")
            lan_address = f"10.{net}.{k + 1}.1"
            plug(site_sw, f"l{tag}{name}", router.name, "lan0", f"{lan_address}/24")
            rt = ["ip", "netns", "exec", router.name]
            _run([*rt, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])
            _run([*rt, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "wan0",
                  "-j", "MASQUERADE", *NAT_FLAGS[name]])
            # A NAT router, not just a translator: inbound only for flows begun inside.
            _run([*rt, "iptables", "-A", "FORWARD", "-i", "wan0", "-m", "conntrack",
                  "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"])
            _run([*rt, "iptables", "-A", "FORWARD", "-i", "wan0", "-j", "DROP"])
            for rule in link.drop_rules() if link is not None else []:
                _run([*rt, "iptables", "-I", "FORWARD", *rule])  # ahead of the accepts
            hosts = []
            for i in range(n):
                h = Host(ns(f"{name}{i}"), f"10.{net}.{k + 1}.{i + 2}")
                plug(site_sw, f"h{tag}{name}{i}", h.name, "eth0", f"{h.address}/24")
                _ip("-n", h.name, "route", "add", "default", "via", lan_address)
                hosts.append(h)
            sites[name] = Site(name, router, lan_address, hosts, bool(NAT_FLAGS[name]))
        yield Wan(public, sites, tuple(p.pid for p in wires))
    finally:
        for p in wires:  # before the namespaces: the line holds their devices
            _stop(p)
        for name in reversed(created):
            _ip("netns", "del", name, check=False)


@contextmanager
def wan_or_skip(site_hosts: tuple[int, int] = (2, 2), public_hosts: int = 1, *, net: int = 79,
                link: Link | None = None) -> Iterator[Wan]:
    """:func:`wan` for a test, which is skipped, with :func:`skip_reason`'s reason, where the
    WAN cannot be built here."""
    import pytest  # only a test calls this: the benchmarks' imports stay free of pytest

    reason = skip_reason(link)
    if reason is not None:
        pytest.skip(reason)
    with wan(site_hosts, public_hosts, net=net, link=link) as w:
        yield w


def punchable(w: Wan, *, routers_drop: bool = True) -> None:
    """Make site b endpoint-independent too (its ``--random-fully`` rule replaced by plain
    MASQUERADE) and, with ``routers_drop``, have both routers drop unsolicited SYNs to their
    own address, as many home routers do, instead of answering them with a RST (whose
    passage back through the other NAT ends the mapping the other side's SYN has just
    opened): the two sites between which DCUtR hole punching works
    (docs/transport.md, "DCUtR")."""
    rt = w.sites["b"].router.command
    _run(rt(["iptables", "-t", "nat", "-F", "POSTROUTING"]))
    _run(rt(["iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "wan0", "-j", "MASQUERADE"]))
    w.sites["b"] = replace(w.sites["b"], random_fully=False)
    if routers_drop:
        drop_unsolicited(w)


def drop_unsolicited(w: Wan) -> None:
    """Both routers drop an unsolicited SYN to their own address (see :func:`punchable`)."""
    for site in w.sites.values():
        _run(site.router.command(["iptables", "-A", "INPUT", "-i", "wan0", "-m", "conntrack",
                                  "--ctstate", "NEW,INVALID", "-j", "DROP"]))
