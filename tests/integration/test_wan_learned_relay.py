"""Relays learned by address exchange (issue 27 item 2), across two NAT'd sites: a public
member runs ``[network] relay_service = true``; one daemon behind each site's router knows
only that member (``bootstrap``), no ``relays``. Each site learns from the public member's
signed address record that it relays, reserves a slot there, and the two sites, which can
reach each other only through it, end up caching each other's entries over the relayed
path. ``peerd status --json`` lists the relay as learned, its reservation held. With
``hole_punch = true`` and sites whose NATs allow it, the learned relay is enough for DCUtR too:
the sites end hole-punched with no relay configured anywhere."""

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
from tests.net.wan import Wan, punchable, wan_or_skip


@pytest.fixture
def net() -> Iterator[Wan]:
    with wan_or_skip((1, 1), 1) as w:
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


def _fleet(tmp_path: Path, net: Wan, **site_network: Any) -> tuple[Node, Node, Node]:
    """Site a's and b's daemons, knowing only the public relay member (``bootstrap``), and
    that member, ``relay_service = true``."""
    a0, b0, pub = make_fleet(tmp_path, 3, hosts=[net.sites["a"].hosts[0],
                                                 net.sites["b"].hosts[0], net.public[0]],
                             base_port=4011, learning={"local_steps": 2})
    write_overrides(pub.config, network={"mdns": False, "static_peers": [], "bootstrap": [],
                                         "relays": [], "relay_service": True})
    for node in (a0, b0):
        write_overrides(node.config, network={"mdns": False, "static_peers": [],
                                              "bootstrap": [pub.multiaddr()], "relays": [],
                                              **site_network})
    return a0, b0, pub


def _until_reserved(a0: Node, b0: Node, pub: Node, running: list[Node]) -> tuple[float, float]:
    """Started and waited for until both sites hold a reservation on the learned relay:
    seconds after start to the daemons answering, and to both reservations."""
    t0 = time.monotonic()
    start((pub, a0, b0), running)
    wait_for(lambda: all(n.status() is not None for n in (pub, a0, b0)), STARTUP_TIMEOUT_S,
             "the daemons to answer", [pub, a0, b0])
    up = time.monotonic()
    wait_for(lambda: _reserved_on_learned(a0, pub.id) and _reserved_on_learned(b0, pub.id),
             60, "both sites to hold a reservation on the learned relay", [pub, a0, b0])
    return up - t0, time.monotonic() - t0


def test_natd_sites_knowing_only_a_public_relay_member_learn_it_and_meet_through_it(
        tmp_path: Path, net: Wan, running: list[Node]) -> None:
    a0, b0, pub = _fleet(tmp_path, net)
    t0 = time.monotonic()
    up, reserved = _until_reserved(a0, b0, pub, running)
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
    print(f"learned relay: daemons answering {up:.1f} s after start, both sites "
          f"reserved on the learned relay {reserved:.1f} s, each caching the other's "
          f"entry {met - t0:.1f} s", file=sys.stderr)


def _path_is(node: Node, other: Node, path: str) -> bool:
    return _row(node, other.id).get("path") == path


def test_natd_sites_hole_punch_through_a_relay_they_only_learned(
        tmp_path: Path, net: Wan, running: list[Node]) -> None:
    """``hole_punch = true`` without ``relays`` (learn_relays on, the default): DCUtR runs
    over the connection relayed by the learned member and the sites end direct."""
    punchable(net)
    a0, b0, pub = _fleet(tmp_path, net, hole_punch=True)
    t0 = time.monotonic()
    up, reserved = _until_reserved(a0, b0, pub, running)
    wait_for(lambda: _path_is(a0, b0, "hole-punched") and _path_is(b0, a0, "hole-punched"),
             90, "each site to show the other's path as hole-punched", [pub, a0, b0])
    punched = time.monotonic()
    for node in (a0, b0):
        assert [r["source"] for r in _relays(node)] == ["learned"]  # nothing configured
        lib = node.status()["libp2p"]  # type: ignore[index]
        assert lib["dcutr_punched"] == 1, lib
        assert lib["dcutr_punches"] >= 1, lib
    print(f"learned relay + hole_punch: daemons answering {up:.1f} s after start, both "
          f"reserved on the learned relay {reserved:.1f} s, both hole-punched "
          f"{punched - t0:.1f} s", file=sys.stderr)
