"""Two NAT'd sites that know nothing but a relay (issue 27, item 2, the member side): one
daemon behind site a's router (endpoint-independent NAT), one behind site b's (``--random-
fully``), each configured with ``[network] relays = [<a relay on the public segment>]`` and
nothing else (no mDNS, no static or bootstrap peers). The relay is a ``peerd relay``: no
member, no fleet. Neither router lets a
connection in, so every byte between the sites goes through the relay: each daemon reserves,
registers its circuit address under the fleet's namespace, finds the other's there, dials it
through the relay, and both end up caching each other's entries. The time is printed."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

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
from tests.integration.relay_sites import relay_fleet, sessions, start_relay, stop_relay
from tests.net.wan import Wan, wan_or_skip


@pytest.fixture
def net(request: pytest.FixtureRequest) -> Iterator[Wan]:
    with wan_or_skip(getattr(request, "param", (1, 1)), 1) as w:
        yield w


@pytest.fixture
def relay(net: Wan, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    proc, addr = start_relay(net.public[0], tmp_path / "relay")
    try:
        yield proc, addr
    finally:
        stop_relay(proc)  # a test may have stopped it already: then this only reaps it


def test_two_natd_sites_configured_with_only_a_relay_cache_each_others_entries(
        tmp_path: Path, net: Wan, relay: tuple[subprocess.Popen[bytes], str],
        running: list[Node]) -> None:
    a0, b0 = make_fleet(tmp_path, 2, hosts=[net.sites["a"].hosts[0], net.sites["b"].hosts[0]],
                        base_port=4011, learning={"local_steps": 2})
    for node in (a0, b0):
        write_overrides(node.config, network={"mdns": False, "static_peers": [],
                                              "bootstrap": [], "relays": [relay[1]]})
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
    # peerd status says how: relayed (while the connection is up; it may be between sweeps).
    wait_for(lambda: all(next(p for p in status(n)["peers"] if p["id"] == o.id)["path"]
                         == "relayed" for n, o in ((a0, b0), (b0, a0))), 30,
             "both to show the other's path as relayed", [a0, b0])
    print(f"two NAT'd sites through a relay: both daemons answering {up - t0:.1f} s after "
          f"start, each caching the other's entry {met - t0:.1f} s after start",
          file=sys.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("net", [(2, 2)], indirect=True)
def test_four_members_in_two_sites_meet_through_a_relay_and_recover_when_it_restarts(
        tmp_path: Path, net: Wan, relay: tuple[subprocess.Popen[bytes], str],
        running: list[Node]) -> None:
    """The long form: two members per site (mDNS inside each site, only the relay across),
    every node caching every other's entry; then the relay is stopped and started again
    (its reservations and rendezvous registrations gone with it), and the time until a
    fresh cross-site session is printed. benchmarks/bench_relay_restart.py repeats the restart
    and renders its readings into docs/reliability.md."""
    nodes = relay_fleet(tmp_path, net, relay[1], mdns=True)
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
    stop_relay(relay[0])
    stopped = time.monotonic()
    before = {(n.id, o.id): sessions(n, o.id) for n, o in ((a0, b0), (b1, a1))}
    proc, again = start_relay(net.public[0], tmp_path / "relay")
    assert again == relay[1]  # the same id: its state directory holds its key
    try:
        restarted = time.monotonic()
        wait_for(lambda: all(sessions(n, o.id) > before[(n.id, o.id)]
                             for n, o in ((a0, b0), (b1, a1))), 120,
                 "fresh cross-site sessions after the relay's restart", nodes)
        back = time.monotonic()
    finally:
        stop_relay(proc)
    print(f"4 members, 2 NAT'd sites, one relay: answering {up - t0:.1f} s after start, "
          f"all caching all {met - t0:.1f} s after start; relay down {restarted - stopped:.1f} s, "
          f"fresh a0->b0 and b1->a1 sessions {back - restarted:.1f} s after its restart",
          file=sys.stderr)


def test_two_sites_with_two_relays_meet_through_the_second_once_the_first_is_killed(
        tmp_path: Path, running: list[Node]) -> None:
    """Relay loss (issue 27): a0 and b0 know ``relays = [r1, r2]`` and nothing else; once
    they cache each other's entries, r1 is killed for good (SIGKILL) and they must complete
    fresh sessions through r2, which the dialler's ``peerd status`` names as the path's
    relay. The time is printed (benchmarks/bench_relay_fallback.py measures it, n ≥ 5).
    Short enough for CI (about 16 s here, most of it start-up)."""
    with wan_or_skip((1, 1), 2) as w:
        (r1, addr1), (r2, addr2) = (start_relay(h, tmp_path / f"relay{i}")
                                    for i, h in enumerate(w.public, 1))
        try:
            a0, b0 = relay_fleet(tmp_path, w, [addr1, addr2], mdns=False)
            start((a0, b0), running)
            wait_for(lambda: a0.status() is not None and b0.status() is not None,
                     STARTUP_TIMEOUT_S, "both daemons to answer", [a0, b0])
            wait_for(lambda: b0.id in cached_origins(a0) and a0.id in cached_origins(b0), 120,
                     "each site to cache the other's entry through a relay", [a0, b0])
            # Both hold reservations at both: each one's record lists both circuits.
            wait_for(lambda: all(sum(a.endswith("/p2p-circuit") for a in next(
                p for p in status(n)["peers"] if p["id"] == o.id)["addrs"]) == 2
                for n, o in ((a0, b0), (b0, a0))), 60,
                "each to know both of the other's circuits", [a0, b0])
            r1.kill()
            r1.wait(timeout=20)
            killed = time.monotonic()
            before = sessions(a0, b0.id), sessions(b0, a0.id)
            wait_for(lambda: sessions(a0, b0.id) > before[0] and sessions(b0, a0.id) > before[1],
                     60, "fresh sessions through the second relay", [a0, b0])
            back = time.monotonic() - killed
            r2_id = addr2.rpartition("/p2p/")[2]
            wait_for(lambda: any(p["id"] == o.id and p.get("relay") == r2_id
                                 for n, o in ((a0, b0), (b0, a0))
                                 for p in status(n)["peers"]), 30,
                     "a path named as through the second relay", [a0, b0])
        finally:
            stop_relay(r2)
            stop_relay(r1)
    print(f"two relays, the first killed: fresh sessions both ways {back:.1f} s after",
          file=sys.stderr)
