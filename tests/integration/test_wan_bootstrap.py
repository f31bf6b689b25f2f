"""Joining through a NAT (issue 27, item 4, first daemon-level piece): two daemons behind
site a's router (tests/net/wan.py) know only a public member (``[network] bootstrap``); the
public member knows nobody and cannot dial into the site. Each side ends up caching the
other's entries over connections the site opened. Then the router forgets every mapping
(``conntrack -F``, a NAT rebinding) and the time until a fresh session completes is printed."""

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
    wait_for,
    write_overrides,
)
from tests.integration.relay_sites import peer_row as _row
from tests.net.wan import Wan, wan_or_skip

pytestmark = pytest.mark.slow


@pytest.fixture
def net() -> Iterator[Wan]:
    with wan_or_skip((2, 0), 1) as w:
        yield w


def _sessions(node: Node, peer_id: str) -> int:
    s = node.status()
    if s is None:
        return -1
    return next((p["sessions"] for p in s["peers"] if p["id"] == peer_id), 0)


def test_site_members_join_a_public_one_through_bootstrap_and_recover_from_a_nat_rebinding(
        tmp_path: Path, net: Wan, running: list[Node]) -> None:
    site = net.sites["a"]
    a0, a1, pub = make_fleet(tmp_path, 3, hosts=[*site.hosts, net.public[0]], mdns=True,
                             base_port=4011, learning={"local_steps": 2})
    for node, known in ((a0, [pub]), (a1, [pub]), (pub, [])):
        write_overrides(node.config, network={
            "mdns": True, "static_peers": [], "bootstrap": [o.multiaddr() for o in known]})
    start((pub, a0, a1), running)
    wait_for(lambda: all(o.id in cached_origins(n)
                         for n, o in ((a0, pub), (a1, pub), (pub, a0), (pub, a1))),
             STARTUP_TIMEOUT_S + 60, "site a and the public member to cache each other's entries",
             [a0, a1, pub])

    # a0 reaches the public member at its public address, outside a0's subnet: a direct
    # path, its RTT measured across the router (issue 27 item 3).
    wait_for(lambda: _row(a0, pub.id).get("rtt_ms") is not None, 30, "a0's RTT to the public "
             "member", [a0, pub])
    row = _row(a0, pub.id)
    assert (row["path"], row["relay"]) == ("direct", None)
    assert row["rtt_ms"] > 0.0
    print(f"a0 -> public member: path {row['path']}, rtt {row['rtt_ms']:.2f} ms; public "
          f"member -> a0: path {_row(pub, a0.id).get('path')} (the router's uplink is on "
          f"the public member's own /24)", file=sys.stderr)

    # For comparison: how long a fresh session takes with the mappings left alone.
    before = _sessions(pub, a0.id)
    t0 = time.monotonic()
    wait_for(lambda: _sessions(pub, a0.id) > before, 60, "a0's next session", [a0, pub])
    undisturbed = time.monotonic() - t0
    before = _sessions(pub, a0.id)
    subprocess.run(site.router.command(["conntrack", "-F"]), check=True, capture_output=True,
                   timeout=10)
    flushed = time.monotonic()
    wait_for(lambda: _sessions(pub, a0.id) > before, 60,
             "a fresh session between a0 and the public member after the flush", [a0, pub])
    print(f"NAT rebinding (conntrack -F on site a's router): a fresh a0<->public session "
          f"{time.monotonic() - flushed:.1f} s later (undisturbed: {undisturbed:.1f} s)",
          file=sys.stderr)
