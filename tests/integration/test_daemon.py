"""Two real daemons swap signed entries and train: on loopback and across namespaces (mDNS)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.mesh import Node, cached_origins, make_fleet, wait_for
from tests.net.netns import NetnsHost


@pytest.fixture
def running() -> Iterator[list[Node]]:
    started: list[Node] = []
    yield started
    for node in started:
        node.stop()


def test_two_daemons_on_loopback_swap_verified_entries_and_train(
    tmp_path: Path, running: list[Node]
) -> None:
    a, b = make_fleet(tmp_path, 2, base_port=47210)
    for node in (a, b):
        node.start()
        running.append(node)
    wait_for(lambda: b.id in cached_origins(a) and a.id in cached_origins(b), 120,
             "each daemon to cache the other's entry", [a, b])
    for me, other in ((a, b), (b, a)):
        status = me.status()
        assert status is not None
        entry = next(c for c in status["cache"] if c["origin"] == other.id)
        assert entry["verified"] is True
        assert entry["received_from"] == other.id
        assert status["node"]["round"] >= 1
        assert status["node"]["version"] >= 1
        assert status["node"]["val_accuracy"] is not None
        assert any(p["id"] == other.id and p["connected"] for p in status["peers"])
    # SIGTERM: clean exit, control socket removed
    assert a.stop() == 0
    assert not a.socket.exists()


def test_restart_resumes_round_version_and_cache(tmp_path: Path, running: list[Node]) -> None:
    a, b = make_fleet(tmp_path, 2, base_port=47220)
    for node in (a, b):
        node.start()
        running.append(node)
    wait_for(lambda: b.id in cached_origins(a), 120, "a to cache b's entry", [a, b])
    wait_for(lambda: (a.status() or {"node": {"version": 0}})["node"]["version"] >= 3, 60,
             "a to publish a few versions", [a])
    before = a.status()
    assert before is not None
    b.stop()  # b is gone: whatever a shows after restart came from disk
    a.stop()
    a.start()
    wait_for(lambda: a.status() is not None, 120, "a to come back", [a])
    after = a.status()
    assert after is not None
    assert after["node"]["version"] >= before["node"]["version"]
    assert after["node"]["round"] >= before["node"]["round"]
    assert b.id in {c["origin"] for c in after["cache"]}
    assert "restored" in a.logs()


def test_two_daemons_in_namespaces_find_each_other_by_mdns(
    tmp_path: Path, running: list[Node], lan: Callable[[int], list[NetnsHost]]
) -> None:
    hosts = lan(2)
    a, b = make_fleet(tmp_path, 2, hosts=hosts, mdns=True, base_port=4011)
    for node in (a, b):
        node.start()
        running.append(node)
    wait_for(lambda: b.id in cached_origins(a) and a.id in cached_origins(b), 120,
             "mDNS discovery and an entry swap both ways", [a, b])
    status = a.status()
    assert status is not None
    peer = next(p for p in status["peers"] if p["id"] == b.id)
    assert peer["source"] == "mdns"
    assert any(hosts[1].address in addr for addr in peer["addrs"])
    assert next(c for c in status["cache"] if c["origin"] == b.id)["verified"] is True
