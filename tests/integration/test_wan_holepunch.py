"""Two NAT'd daemons that know nothing but a relay, hole-punched (issue 27 item 3): one daemon
behind each site's router, both endpoint-independent and dropping unsolicited SYNs
(tests/net/wan.py's :func:`punchable`), each configured with ``[network] relays = [<a peerd
relay on the public segment>]`` and ``hole_punch = true`` and nothing else (no mDNS, no
static or bootstrap peers). They meet through the relay, DCUtR (peerd/net/dcutr.py) punches a
direct connection, and ``peerd peers --json`` on each side ends with the other's path
``hole-punched`` over a direct connection to the other router, each caching the other's
entry, and the sessions that follow run over the punched connection (the routers' flow byte
counts). The times are printed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.mesh import (
    PEERD,
    STARTUP_TIMEOUT_S,
    Node,
    cached_origins,
    make_fleet,
    start,
    wait_for,
    write_overrides,
)
from tests.integration.relay_sites import sessions, start_relay, stop_relay
from tests.net.wan import Wan, punchable, wan_or_skip


@pytest.fixture
def net() -> Iterator[Wan]:
    with wan_or_skip((1, 1), 1) as w:
        punchable(w)
        # Byte counts per flow (per namespace; off by default): which path the sessions take.
        subprocess.run(w.sites["a"].router.command(
            ["sh", "-c", "echo 1 > /proc/sys/net/netfilter/nf_conntrack_acct"]),
            check=True, timeout=30)
        yield w


def _peers(node: Node) -> list[dict[str, Any]]:
    """``peerd peers --json`` of ``node`` (empty when it does not answer)."""
    out = subprocess.run([*PEERD, "peers", "--socket", str(node.socket), "--json"],
                         capture_output=True, text=True, timeout=30, check=False)
    if out.returncode != 0:
        return []
    parsed = json.loads(out.stdout)
    peers: list[dict[str, Any]] = parsed["peers"] if isinstance(parsed, dict) else parsed
    return peers


def _flow_bytes(net: Wan) -> dict[str, int]:
    """Bytes (both directions) site a's router counted on its TCP flows with site b's public
    address (``direct``) and with the relay (``relay``)."""
    out = subprocess.run(net.sites["a"].router.command(["conntrack", "-L", "-p", "tcp"]),
                         capture_output=True, text=True, timeout=30, check=True).stdout
    peers = {"direct": net.sites["b"].router.address, "relay": net.public[0].address}
    total = dict.fromkeys(peers, 0)
    for line in out.splitlines():
        for kind, ip in peers.items():
            if f" dst={ip} " in line:
                total[kind] += sum(int(w[6:]) for w in line.split() if w.startswith("bytes="))
    return total


def _path(node: Node, other: Node) -> str | None:
    return next((p.get("path") for p in _peers(node) if p["id"] == other.id), None)


def _pair(tmp_path: Path, net: Wan, relay_addr: str) -> tuple[Node, Node]:
    a0, b0 = make_fleet(tmp_path, 2, hosts=[net.sites["a"].hosts[0], net.sites["b"].hosts[0]],
                        base_port=4011, learning={"local_steps": 2})
    for node in (a0, b0):
        write_overrides(node.config, network={
            "mdns": False, "static_peers": [], "bootstrap": [], "relays": [relay_addr],
            "hole_punch": True})
    return a0, b0


def _until_punched(a0: Node, b0: Node, running: list[Node]) -> None:
    start((a0, b0), running)
    wait_for(lambda: a0.status() is not None and b0.status() is not None,
             STARTUP_TIMEOUT_S, "both daemons to answer", [a0, b0])
    wait_for(lambda: _path(a0, b0) == "hole-punched" and _path(b0, a0) == "hole-punched",
             60, "each to show the other's path as hole-punched", [a0, b0])


def test_two_natd_sites_with_only_a_relay_end_hole_punched(
        tmp_path: Path, net: Wan, running: list[Node]) -> None:
    t_relay = time.monotonic()
    relay, relay_addr = start_relay(net.public[0], tmp_path / "relay")
    relay_up = time.monotonic() - t_relay
    try:
        a0, b0 = _pair(tmp_path, net, relay_addr)
        fleet_made = time.monotonic() - t_relay - relay_up
        t0 = time.monotonic()
        start((a0, b0), running)
        wait_for(lambda: a0.status() is not None and b0.status() is not None,
                 STARTUP_TIMEOUT_S, "both daemons to answer", [a0, b0])
        up = time.monotonic()
        wait_for(lambda: _path(a0, b0) == "hole-punched" and _path(b0, a0) == "hole-punched",
                 60, "each to show the other's path as hole-punched", [a0, b0])
        punched = time.monotonic()
        wait_for(lambda: b0.id in cached_origins(a0) and a0.id in cached_origins(b0), 60,
                 "each site to cache the other's entry", [a0, b0])
        met = time.monotonic()
        # The sessions run over the punched connection, router to router, not through the
        # relay: over two fresh sessions, site a's router counts more bytes on the flow with
        # site b's public address than on its flows with the relay (203.0.113.10).
        before = _flow_bytes(net)
        done = sessions(a0, b0.id) + sessions(b0, a0.id)
        wait_for(lambda: sessions(a0, b0.id) + sessions(b0, a0.id) >= done + 2, 60,
                 "two more sessions between the sites", [a0, b0])
        after = _flow_bytes(net)
        two_more = time.monotonic() - met
        direct = after["direct"] - before["direct"]
        relayed = after["relay"] - before["relay"]
        assert direct > relayed, (before, after)
        for node, other in ((a0, b0), (b0, a0)):
            assert _path(node, other) == "hole-punched"
            lib = node.status()["libp2p"]  # type: ignore[index]
            assert lib["dcutr_punched"] == 1, lib
            assert lib["dcutr_punches"] >= 1, lib
        print(f"two NAT'd sites, relay + hole_punch: relay serving after {relay_up:.1f} s, "
              f"fleet and configs made in {fleet_made:.1f} s; both answering "
              f"{up - t0:.1f} s after start, both hole-punched {punched - t0:.1f} s, each "
              f"caching the other's entry {met - t0:.1f} s; over the next two sessions "
              f"({two_more:.1f} s) {direct} bytes on the punched flow, {relayed} through "
              "the relay", file=sys.stderr)
    finally:
        stop_relay(relay)


@pytest.mark.long  # 107-142 s on 2 loaded cores; the test above is the CI form
def test_the_path_stays_hole_punched_after_the_relayed_leg_closes(
        tmp_path: Path, net: Wan, running: list[Node]) -> None:
    """py-libp2p closes the relayed connection 60 s after a punch and then forgets the peer
    was punched (mend 16): the path must still read hole-punched, and entries still flow."""
    relay, relay_addr = start_relay(net.public[0], tmp_path / "relay")
    try:
        a0, b0 = _pair(tmp_path, net, relay_addr)
        _until_punched(a0, b0, running)
        time.sleep(75)  # RELAY_CLOSE_GRACE_PERIOD (60 s) and a sweep
        done = sessions(a0, b0.id) + sessions(b0, a0.id)
        wait_for(lambda: sessions(a0, b0.id) + sessions(b0, a0.id) >= done + 2, 60,
                 "two more sessions between the sites", [a0, b0])
        for node, other in ((a0, b0), (b0, a0)):
            assert _path(node, other) == "hole-punched", _peers(node)
    finally:
        stop_relay(relay)
