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
def net() -> Iterator[Wan]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with wan((1, 1), 1) as w:
        yield w


@pytest.fixture
def relay_addr(net: Wan, tmp_path: Path) -> Iterator[str]:
    host = net.public[0]
    log = tmp_path / "relay.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(host.python("-m", "tests.net.relay_proc", RELAY_SEED.hex(),
                                            str(RELAY_PORT)),
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                cwd=Path(__file__).resolve().parents[2])
    try:
        deadline = time.monotonic() + 60
        while b"READY" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "the relay did not start"
            time.sleep(0.2)
        relay_id = node_id_of(private_key_from_seed(RELAY_SEED))
        yield f"/ip4/{host.address}/tcp/{RELAY_PORT}/p2p/{relay_id}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_two_natd_sites_configured_with_only_a_relay_cache_each_others_entries(
        tmp_path: Path, net: Wan, relay_addr: str, running: list[Node]) -> None:
    a0, b0 = make_fleet(tmp_path, 2, hosts=[net.sites["a"].hosts[0], net.sites["b"].hosts[0]],
                        base_port=4011, learning={"local_steps": 2})
    for node in (a0, b0):
        write_overrides(node.config, network={"mdns": False, "static_peers": [],
                                              "bootstrap": [], "relays": [relay_addr]})
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
          f"start, each caching the other's entry {met - up:.1f} s later", file=sys.stderr)
