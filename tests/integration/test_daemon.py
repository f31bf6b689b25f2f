"""Two real daemons swap signed entries and train: on loopback and across namespaces (mDNS)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.integration.mesh import Node, cached_origins, make_fleet, start, status, wait_for
from tests.net.netns import NetnsHost


def test_two_daemons_on_loopback_swap_verified_entries_and_train(
    tmp_path: Path, running: list[Node]
) -> None:
    a, b = make_fleet(tmp_path, 2, base_port=27210)
    start((a, b), running)
    wait_for(lambda: b.id in cached_origins(a) and a.id in cached_origins(b), 120,
             "each daemon to cache the other's entry", [a, b])
    for me, other in ((a, b), (b, a)):
        s = status(me)
        entry = next(c for c in s["cache"] if c["origin"] == other.id)
        assert entry["verified"] is True
        assert entry["received_from"] == other.id
        assert s["node"]["round"] >= 1
        assert s["node"]["version"] >= 1
        assert s["node"]["val_accuracy"] is not None
        assert any(p["id"] == other.id and p["connected"] for p in s["peers"])
    # Each reaches the other over loopback (this host: "lan"), its RTT measured by libp2p
    # ping within a tick or two of connecting (issue 27 item 3).
    for me, other in ((a, b), (b, a)):
        def measured(me: Node = me, other: Node = other) -> bool:
            return _rtt(me, other) is not None

        wait_for(measured, 30, "a measured RTT", [a, b])
        row = next(p for p in status(me)["peers"] if p["id"] == other.id)
        assert (row["path"], row["relay"]) == ("lan", None)
        assert 0.0 < row["rtt_ms"] < 1000.0
        assert 0.0 < row["rtt_last_ms"] < 1000.0
    # SIGTERM: clean exit, control socket removed
    assert a.stop() == 0
    assert not a.socket.exists()


def _rtt(me: Node, other: Node) -> float | None:
    s = me.status()
    row = None if s is None else next((p for p in s["peers"] if p["id"] == other.id), None)
    return None if row is None else row["rtt_ms"]


def test_restart_resumes_round_version_and_cache(tmp_path: Path, running: list[Node]) -> None:
    a, b = make_fleet(tmp_path, 2, base_port=27220)
    start((a, b), running)
    wait_for(lambda: b.id in cached_origins(a), 120, "a to cache b's entry", [a, b])
    wait_for(lambda: (a.status() or {"node": {"version": 0}})["node"]["version"] >= 3, 60,
             "a to publish a few versions", [a])
    before = status(a)
    b.stop()  # b is gone: whatever a shows after restart came from disk
    a.stop()
    a.start()
    wait_for(lambda: a.status() is not None, 120, "a to come back", [a])
    after = status(a)
    assert after["node"]["version"] >= before["node"]["version"]
    assert after["node"]["round"] >= before["node"]["round"]
    assert b.id in {c["origin"] for c in after["cache"]}
    assert "restored" in a.logs()


def test_two_daemons_in_namespaces_find_each_other_by_mdns(
    tmp_path: Path, running: list[Node], lan: Callable[[int], list[NetnsHost]]
) -> None:
    hosts = lan(2)
    a, b = make_fleet(tmp_path, 2, hosts=hosts, mdns=True, base_port=4011)
    start((a, b), running)
    wait_for(lambda: b.id in cached_origins(a) and a.id in cached_origins(b), 120,
             "mDNS discovery and an entry swap both ways", [a, b])

    def source(n: Node, other: Node) -> str | None:
        row = next((p for p in status(n)["peers"] if p["id"] == other.id), None)
        return None if row is None else str(row["source"])

    # Whoever dialled first, the other may know it from that session (its address record:
    # "exchanged") until its own mDNS browser resolves the record; then the LAN's word wins.
    wait_for(lambda: source(a, b) == "mdns" and source(b, a) == "mdns", 60,
             "each to list the other as found by mDNS", [a, b])
    s = status(a)
    peer = next(p for p in s["peers"] if p["id"] == b.id)
    assert peer["source"] == "mdns"
    assert any(hosts[1].address in addr for addr in peer["addrs"])
    assert next(c for c in s["cache"] if c["origin"] == b.id)["verified"] is True
    assert peer["path"] == "lan"  # on one bridge, and mDNS found it
