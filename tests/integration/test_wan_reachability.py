"""Reachability in the test WAN (issue 27 item 3): a ``peerd relay`` on the public segment
dials back whoever asks (AutoNAT v1, peerd.net.autonat). A member on the public segment is
judged ``public`` and drops its reservation; a member behind site a's NAT router is judged
``private`` and keeps its. Both are configured with nothing but ``relays = [<the relay>]``,
and still meet: the public one finds the NAT'd one's circuit at the rendezvous point.

The private verdict is what a dial-back on the request's own connection (py-libp2p's
``AutoNATService``: ``host.connect`` returns the open connection) cannot give: through that
connection every asker is reached, so the NAT'd member would be judged public and drop the
one path others have to it."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
from tests.integration.relay_sites import start_relay, stop_relay
from tests.net.wan import Wan, wan_or_skip


@pytest.fixture
def net() -> Iterator[Wan]:
    with wan_or_skip((1, 0), 2) as w:
        yield w


def _verdict(node: Node) -> Any:
    s = node.status()
    return None if s is None or s.get("reachability") is None \
        else s["reachability"]["verdict"]


@pytest.mark.long  # ~60 s on 2 loaded cores; tests/net/test_autonat_netns.py is the CI form
def test_the_public_member_is_public_and_the_natd_one_private(
        tmp_path: Path, net: Wan, running: list[Node]) -> None:
    proc, relay = start_relay(net.public[0], tmp_path / "relay")
    try:
        pub, nat = make_fleet(tmp_path, 2, hosts=[net.public[1], net.sites["a"].hosts[0]],
                              base_port=4011, learning={"local_steps": 2})
        for node in (pub, nat):
            write_overrides(node.config, network={"mdns": False, "static_peers": [],
                                                  "bootstrap": [], "relays": [relay]})
        t0 = time.monotonic()
        start((pub, nat), running)
        wait_for(lambda: _verdict(pub) == "public" and _verdict(nat) == "private",
                 STARTUP_TIMEOUT_S + 30, "the verdicts: public and private", [pub, nat])
        judged = time.monotonic()
        for node, reached in ((pub, 1), (nat, 0)):
            r = status(node)["reachability"]
            assert (r["servers"], r["reached"], r["not_reached"]) == (1, reached, 1 - reached)
        # The decision: the public member holds no reservation, the NAT'd one does.
        wait_for(lambda: "no reservation needed" in pub.logs(), 20,
                 "the public member to drop its reservation", [pub])
        assert "no reservation needed" not in nat.logs()
        assert "reservation held" in nat.logs()
        # And they still meet: the NAT'd member's circuit is at the rendezvous point.
        wait_for(lambda: nat.id in cached_origins(pub) and pub.id in cached_origins(nat), 90,
                 "each to cache the other's entry", [pub, nat])
        met = time.monotonic()
        print(f"reachability: both judged {judged - t0:.1f} s after start, entries "
              f"exchanged {met - t0:.1f} s after start", file=sys.stderr)
    finally:
        stop_relay(proc)
