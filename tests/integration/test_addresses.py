"""A daemon whose address changes under it (issue 12, items 9 and 10): two real daemons in
namespaces, found by mDNS; one host's address is replaced as a DHCP renewal or a move to
another network would; the other must find it at the new address and get fresh entries
from it, without a restart. ``peerd status`` lists concrete addresses throughout."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from peerd.net.addrs import ADDRESS_POLL_S
from tests.integration.mesh import (
    STARTUP_TIMEOUT_S,
    Node,
    cached_origins,
    make_fleet,
    start,
    status,
    wait_for,
)
from tests.net.netns import IP_CMD_TIMEOUT_S, SUBNET, NetnsHost


def test_a_daemon_is_found_at_its_new_address_and_its_entries_keep_flowing(
    tmp_path: Path, running: list[Node], lan: Callable[[int], list[NetnsHost]]
) -> None:
    hosts = lan(2)
    a, b = make_fleet(tmp_path, 2, hosts=hosts, mdns=True, base_port=4011,
                      learning={"local_steps": 3})
    start((a, b), running)
    wait_for(lambda: a.id in cached_origins(b) and b.id in cached_origins(a),
             STARTUP_TIMEOUT_S + 30, "mDNS discovery and an entry swap both ways", [a, b])
    # Item 10: bound to 0.0.0.0, the status lists where the node is reachable.
    assert status(a)["node"]["listen"] == [f"/ip4/{hosts[0].address}/tcp/{a.port}"]

    new = f"{SUBNET}.101"
    ns = hosts[0]
    subprocess.run(ns.command(["sh", "-c", "echo 1 > "
                               "/proc/sys/net/ipv4/conf/eth0/promote_secondaries"]),
                   check=True, timeout=IP_CMD_TIMEOUT_S)
    for args in (("add", f"{new}/24"), ("del", f"{ns.address}/24")):
        subprocess.run(["ip", "-n", ns.name, "addr", *args, "dev", "eth0"], check=True,
                       timeout=IP_CMD_TIMEOUT_S)
    changed = time.time()

    def b_knows_the_new_address() -> bool:
        peer = next((p for p in status(b)["peers"] if p["id"] == a.id), None)
        return peer is not None and any(f"/ip4/{new}/" in addr for addr in peer["addrs"])

    wait_for(b_knows_the_new_address, ADDRESS_POLL_S + 15, "b to learn a's new address",
             [a, b])

    def b_has_a_fresh_entry_of_a() -> bool:
        return any(c["origin"] == a.id and c["created_at"] > changed
                   and c["received_from"] == a.id for c in status(b)["cache"])

    wait_for(b_has_a_fresh_entry_of_a, 60, "an entry a made after the change to reach b",
             [a, b])
    assert status(a)["node"]["listen"] == [f"/ip4/{new}/tcp/{a.port}"]
    peer = next(p for p in status(b)["peers"] if p["id"] == a.id)
    assert all(f"/ip4/{ns.address}/" not in addr for addr in peer["addrs"]), peer
