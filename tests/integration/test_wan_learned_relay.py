"""Relays learned by address exchange (issue 27 item 2), across two NAT'd sites: a public
member runs ``[network] relay_service = true``; one daemon behind each site's router knows
only that member (``bootstrap``), no ``relays``. Each site learns from the public member's
signed address record that it relays, reserves a slot there, and the two sites, which can
reach each other only through it, end up caching each other's entries over the relayed
path. ``peerd status --json`` lists the relay as learned, its reservation held."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

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
from tests.net.wan import Wan, skip_reason, wan


@pytest.fixture
def net() -> Iterator[Wan]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with wan((1, 1), 1) as w:
        yield w


def _relays(node: Node) -> list[dict[str, Any]]:
    s = node.status()
    reach = None if s is None else s.get("reachability")
    return [] if reach is None else list(reach["relays"])


def _reserved_on_learned(node: Node, relay_id: str) -> bool:
    return any(r["source"] == "learned" and r["addr"].endswith(f"/p2p/{relay_id}")
               and r["reserved_until"] is not None for r in _relays(node))


def _relayed(node: Node, other: Node, seen: list[dict[str, Any]]) -> bool:
    row = _row(node, other.id)
    seen.append(row)
    return row.get("path") == "relayed"


def test_natd_sites_knowing_only_a_public_relay_member_learn_it_and_meet_through_it(
        tmp_path: Path, net: Wan, running: list[Node]) -> None:
    a0, b0, pub = make_fleet(tmp_path, 3, hosts=[net.sites["a"].hosts[0],
                                                 net.sites["b"].hosts[0], net.public[0]],
                             base_port=4011, learning={"local_steps": 2})
    write_overrides(pub.config, network={"mdns": False, "static_peers": [], "bootstrap": [],
                                         "relays": [], "relay_service": True})
    for node in (a0, b0):
        write_overrides(node.config, network={"mdns": False, "static_peers": [],
                                              "bootstrap": [pub.multiaddr()], "relays": []})
    t0 = time.monotonic()
    start((pub, a0, b0), running)
    wait_for(lambda: all(n.status() is not None for n in (pub, a0, b0)), STARTUP_TIMEOUT_S,
             "the daemons to answer", [pub, a0, b0])
    up = time.monotonic()
    wait_for(lambda: _reserved_on_learned(a0, pub.id) and _reserved_on_learned(b0, pub.id),
             60, "both sites to hold a reservation on the learned relay", [pub, a0, b0])
    reserved = time.monotonic()
    wait_for(lambda: b0.id in cached_origins(a0) and a0.id in cached_origins(b0), 90,
             "each site to cache the other's entry", [pub, a0, b0])
    met = time.monotonic()
    for node, other in ((a0, b0), (b0, a0)):
        [relay] = _relays(node)  # the public member, learned; nothing configured
        assert relay["addr"] == f"/ip4/{net.public[0].address}/tcp/{pub.port}/p2p/{pub.id}"
        # Only the relay joins the sites: while connected, the other site is reached
        # relayed (a connection may be closed between sessions: waited for, not sampled).
        seen: list[dict[str, Any]] = []
        wait_for(partial(_relayed, node, other, seen), 30,
                 f"{node.name} to show the other site's path as relayed", [pub, a0, b0])
        assert seen[-1]["relay"] in (pub.id, None)  # None: the addresses do not name it
        assert next(c["received_from"] for c in node.status()["cache"]  # type: ignore[index]
                    if c["origin"] == other.id) in (other.id, pub.id)
    assert _relays(pub) == []  # never its own relay
    print(f"learned relay: daemons answering {up - t0:.1f} s after start, both sites "
          f"reserved on the learned relay {reserved - t0:.1f} s, each caching the other's "
          f"entry {met - t0:.1f} s", file=sys.stderr)
