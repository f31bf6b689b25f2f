"""Two NAT'd sites that know nothing but a relay (issue 27, item 2, the member side): one
daemon behind site a's router (endpoint-independent NAT), one behind site b's (``--random-
fully``), each configured with ``[network] relays = [<a relay on the public segment>]`` and
nothing else (no mDNS, no static or bootstrap peers). The relay is not a member (the stand-in
of tests/net/relay_proc.py: py-libp2p's hop and rendezvous point). Neither router lets a
connection in, so every byte between the sites goes through the relay: each daemon reserves,
registers its circuit address under the fleet's namespace, finds the other's there, dials it
through the relay, and both end up caching each other's entries. The time is printed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from peerd.mesh.netns import Host
from peerd.protocol.identity import node_id_of, private_key_from_seed
from tests.integration.mesh import (
    STARTUP_TIMEOUT_S,
    Node,
    cached_origins,
    make_fleet,
    start,
    status,
    wait_for,
    write_overrides,
)
from tests.net.wan import Wan, skip_reason, wan

RELAY_PORT = 4011
RELAY_SEED = bytes(range(32))


@pytest.fixture
def net(request: pytest.FixtureRequest) -> Iterator[Wan]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with wan(getattr(request, "param", (1, 1)), 1) as w:
        yield w


def start_relay(host: Host, log: Path) -> subprocess.Popen[bytes]:
    """The stand-in relay in ``host``'s namespace, once it serves (its output in ``log``)."""
    with log.open("ab") as out:
        proc = subprocess.Popen(host.python("-m", "tests.net.relay_proc", RELAY_SEED.hex(),
                                            str(RELAY_PORT)),
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                cwd=Path(__file__).resolve().parents[2])
    ready = log.read_bytes().count(b"READY") + 1
    deadline = time.monotonic() + 60
    while log.read_bytes().count(b"READY") < ready:
        assert proc.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, "the relay did not start"
        time.sleep(0.2)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=20)


@pytest.fixture
def relay_proc(net: Wan, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = start_relay(net.public[0], tmp_path / "relay.log")
    try:
        yield proc
    finally:
        stop(proc)  # a test may have stopped it already: then this only reaps it


def relay_addr(net: Wan) -> str:
    relay_id = node_id_of(private_key_from_seed(RELAY_SEED))
    return f"/ip4/{net.public[0].address}/tcp/{RELAY_PORT}/p2p/{relay_id}"


def _sessions(node: Node, peer_id: str) -> int:
    s = node.status()
    if s is None:
        return -1
    return next((p["sessions"] for p in s["peers"] if p["id"] == peer_id), 0)


def test_two_natd_sites_configured_with_only_a_relay_cache_each_others_entries(
        tmp_path: Path, net: Wan, relay_proc: subprocess.Popen[bytes],
        running: list[Node]) -> None:
    a0, b0 = make_fleet(tmp_path, 2, hosts=[net.sites["a"].hosts[0], net.sites["b"].hosts[0]],
                        base_port=4011, learning={"local_steps": 2})
    for node in (a0, b0):
        write_overrides(node.config, network={"mdns": False, "static_peers": [],
                                              "bootstrap": [], "relays": [relay_addr(net)]})
    t0 = time.monotonic()
    start((a0, b0), running)
    wait_for(lambda: a0.status() is not None and b0.status() is not None, STARTUP_TIMEOUT_S,
             "both daemons to answer", [a0, b0])
    up = time.monotonic()
    wait_for(lambda: b0.id in cached_origins(a0) and a0.id in cached_origins(b0), 120,
             "each site to cache the other's entry through the relay", [a0, b0])
    met = time.monotonic()
    for node, other in ((a0, b0), (b0, a0)):
        peer = next(p for p in status(node)["peers"] if p["id"] == other.id)
        assert any(a.endswith("/p2p-circuit") for a in peer["addrs"]), peer
    print(f"two NAT'd sites through a relay: both daemons answering {up - t0:.1f} s after "
          f"start, each caching the other's entry {met - t0:.1f} s after start",
          file=sys.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("net", [(2, 2)], indirect=True)
def test_four_members_in_two_sites_meet_through_a_relay_and_recover_when_it_restarts(
        tmp_path: Path, net: Wan, relay_proc: subprocess.Popen[bytes],
        running: list[Node]) -> None:
    """The long form: two members per site (mDNS inside each site, only the relay across),
    every node caching every other's entry; then the relay is stopped and started again
    (its reservations and rendezvous registrations gone with it), and the time until a
    fresh cross-site session is printed."""
    a, b = net.sites["a"], net.sites["b"]
    nodes = make_fleet(tmp_path, 4, hosts=[*a.hosts, *b.hosts], mdns=True, base_port=4011,
                       learning={"local_steps": 2})
    for node in nodes:
        write_overrides(node.config, network={"mdns": True, "static_peers": [],
                                              "bootstrap": [], "relays": [relay_addr(net)]})
    a0, a1, b0, b1 = nodes
    t0 = time.monotonic()
    start(nodes, running)
    wait_for(lambda: all(n.status() is not None for n in nodes), STARTUP_TIMEOUT_S,
             "the daemons to answer", nodes)
    up = time.monotonic()
    wait_for(lambda: all({o.id for o in nodes if o is not n} <= cached_origins(n)
                         for n in nodes), 180, "every node to cache every other's entry",
             nodes)
    met = time.monotonic()
    # The relay restarts: its hop and rendezvous state is gone, and so is every circuit.
    stop(relay_proc)
    stopped = time.monotonic()
    before = {(n.id, o.id): _sessions(n, o.id) for n, o in ((a0, b0), (b1, a1))}
    proc = start_relay(net.public[0], tmp_path / "relay.log")
    try:
        restarted = time.monotonic()
        wait_for(lambda: all(_sessions(n, o.id) > before[(n.id, o.id)]
                             for n, o in ((a0, b0), (b1, a1))), 120,
                 "fresh cross-site sessions after the relay's restart", nodes)
        back = time.monotonic()
    finally:
        stop(proc)
    print(f"4 members, 2 NAT'd sites, one relay: answering {up - t0:.1f} s after start, "
          f"all caching all {met - t0:.1f} s after start; relay down {restarted - stopped:.1f} s, "
          f"fresh a0->b0 and b1->a1 sessions {back - restarted:.1f} s after its restart",
          file=sys.stderr)
