"""Issue 5's multi-host scenarios on real `peerd run` processes, real sockets and real multicast.

Each test builds its own network (loopback for the ones about gossip logic, network
namespaces for the ones about discovery and links), starts a fleet of daemons and asserts on
what `peerd status --json` reports (over the control socket) and on each node's audit log.
Durations are in docs/integration.md; every wait is polled with a timeout, never slept.
"""

from __future__ import annotations

import itertools
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from peerd.core.reasons import BENIGN
from peerd.learn.tasks import load_task
from peerd.store.keyfile import NODE_KEY_FILE, read_private_key
from tests.integration.hostile import Target, corrupt, hostile_peer, item_of, make_entry
from tests.integration.mesh import (
    STARTUP_TIMEOUT_S,
    Node,
    audit,
    cached_origins,
    make_fleet,
    peerd,
    start,
    status,
    wait_for,
    write_overrides,
)
from tests.integration.topology import Topology
from tests.net.netns import NetnsHost

pytestmark = pytest.mark.integration

#: Fewer SGD steps than the default: these scenarios test gossip, not learning, and the CI
#: machine has two cores for up to six daemons.
LIGHT = {"local_steps": 3}


def is_ready(node: Node) -> bool:
    """The daemon has announced itself (audit `ready`: transport, control socket and mDNS
    are up) since its latest start."""
    events = [e["event"] for e in audit(node)]
    if "start" not in events:
        return False
    last_start = len(events) - 1 - events[::-1].index("start")
    return "ready" in events[last_start:]


def wait_ready(nodes: list[Node]) -> None:
    wait_for(lambda: all(is_ready(n) for n in nodes), STARTUP_TIMEOUT_S,
             "all daemons to be ready", nodes)


def entry(s: dict[str, Any], origin: str) -> dict[str, Any]:
    return next(c for c in s["cache"] if c["origin"] == origin)


def peer(s: dict[str, Any], peer_id: str) -> dict[str, Any] | None:
    return next((p for p in s["peers"] if p["id"] == peer_id), None)


def refused_in_audit(node: Node, peer: str | None = None,
                     benign: bool = False) -> dict[str, int]:
    """Refusal counts by reason from the audit log, optionally only those of one ``peer``.

    Benign reasons (not_newer, stale, …) are left out unless asked for: between honest peers
    two concurrent sessions may both fetch one entry, and the later copy is dropped as
    not_newer; that is normal gossip, not a refusal a scenario should fail on."""
    out: dict[str, int] = {}
    for e in audit(node):
        if e["event"] == "refused" and (peer is None or e["peer"] == peer) \
                and (benign or e["reason"] not in BENIGN):
            out[e["reason"]] = out.get(e["reason"], 0) + e["count"]
    return out


# ---------------------------------------------------------------------------- 1 discovery
def test_1_discovery_three_hosts_find_each_other_by_mdns_alone(
    tmp_path: Path, lan: Callable[[int], list[NetnsHost]], running: list[Node]
) -> None:
    hosts = lan(3)
    nodes = make_fleet(tmp_path, 3, hosts=hosts, mdns=True, base_port=4011, learning=LIGHT)
    start(nodes, running)
    wait_ready(nodes)
    # The 30 s of the issue count from "every daemon is up": start-up itself (imports of
    # torch and libp2p) takes longer than that on a loaded CI machine.
    t0 = time.monotonic()

    def complete() -> bool:
        for n in nodes:
            s = n.status()
            if s is None:
                return False
            others = {o.id for o in nodes if o is not n}
            if not others <= {c["origin"] for c in s["cache"]}:
                return False
            if {p["id"] for p in s["peers"]} != others:
                return False
        return True

    wait_for(complete, 30, "each host to hold both others' entries, found by mDNS", nodes)
    print(f"\nscenario 1: full mesh by mDNS {time.monotonic() - t0:.1f} s after all ready")

    def by_mdns() -> bool:
        # The third host may have handed two hosts each other's address records (address
        # exchange) before either's browser resolved the other: wait for the LAN's word.
        views = {n.id: {p["id"]: p["source"] for p in status(n)["peers"]} for n in nodes}
        return all("mdns" in {views[n.id].get(o.id), views[o.id].get(n.id)}
                   for n in nodes for o in nodes if o is not n)

    wait_for(by_mdns, 60, "every pair to have found each other by mDNS", nodes)
    for n in nodes:
        s = status(n)
        for o, other_host in zip(nodes, hosts, strict=True):
            if o is n:
                continue
            e = entry(s, o.id)
            # Verified against o's own key, whoever relayed it (on one LAN it may come
            # straight from o or through the third host, whichever session ran first).
            assert e["verified"] is True
            assert e["received_from"] in {x.id for x in nodes if x is not n}
            p = peer(s, o.id)
            assert p is not None
            if p["source"] == "mdns":  # the record named o's namespace address
                assert any(other_host.address in a for a in p["addrs"])
        # No static peers were configured: mDNS alone found them (each pair: at least one
        # side from the other's record, the other side may know it from the inbound dial
        # that followed, and from that session's address exchange until its own mDNS record
        # arrives; see the wait above), and nobody was refused.
        for o in nodes:
            if o is not n:
                mine, theirs = peer(s, o.id), peer(status(o), n.id)
                assert mine is not None
                assert theirs is not None
                assert "mdns" in {mine["source"], theirs["source"]}
                assert {mine["source"], theirs["source"]} <= {"mdns", "inbound", "exchanged"}
        assert s["rejected"] == {}
        assert refused_in_audit(n) == {}


# ---------------------------------------------------------------------------- 2 relay
def test_2_relay_over_a_line_keeps_the_origin_signature(
    tmp_path: Path, net: Topology, running: list[Node]
) -> None:
    # a – b – c: two bridges, b on both, a and c share no link (and b does not route).
    net.bridge("left")
    net.bridge("right")
    hosts = [net.host("a", ("left", "10.78.1.1/24")),
             net.host("b", ("left", "10.78.1.2/24"), ("right", "10.78.2.2/24")),
             net.host("c", ("right", "10.78.2.3/24"))]
    a, b, c = make_fleet(tmp_path, 3, hosts=hosts, mdns=True, base_port=4011, learning=LIGHT)
    start([a, b, c], running)
    wait_ready([a, b, c])
    t0 = time.monotonic()
    wait_for(lambda: a.id in cached_origins(c) and c.id in cached_origins(a), 90,
             "a's entry to reach c through b (and c's to reach a)", [a, b, c])
    print(f"\nscenario 2: relayed both ways {time.monotonic() - t0:.1f} s after all ready")
    sc, sa = status(c), status(a)
    e = entry(sc, a.id)
    # Received from b, yet verified: c checked a's own signature on the bytes b relayed.
    assert e["received_from"] == b.id
    assert e["verified"] is True
    assert entry(sa, c.id)["received_from"] == b.id
    # a and c never talked: neither discovered the other, and though b handed each the
    # other's signed address record (address exchange), they share no link, so neither
    # connected to nor held a session with the other.
    for s, other in ((sc, a), (sa, c)):
        p = peer(s, other.id)
        if p is not None:
            assert p["source"] == "exchanged", p
            assert not p["connected"], p
            assert p["sessions"] == 0, p
    assert sc["rejected"] == {}
    assert sa["rejected"] == {}


# ---------------------------------------------------------------------------- 8 hostile peer
def test_8_hostile_peer_is_refused_by_reason_and_the_daemon_keeps_its_cache(
    tmp_path: Path, running: list[Node]
) -> None:
    # a and b are honest daemons on loopback; the third member's key is driven by the test's
    # hostile client (a real libp2p host speaking the session protocol), never by a daemon.
    a, b, spy = make_fleet(tmp_path, 3, base_port=27300, learning=LIGHT)
    for me, other in ((a, b), (b, a)):
        write_overrides(me.config, network={"static_peers": [other.multiaddr()]})
    start([a, b], running)
    wait_for(lambda: b.id in cached_origins(a), STARTUP_TIMEOUT_S, "a to cache b's entry", [a, b])
    fleet = json.loads((tmp_path / "fleet" / "fleet.json").read_text())
    fleet_id = bytes.fromhex(fleet["fleet_id"])
    key = read_private_key(spy.dir / NODE_KEY_FILE)
    params = load_task("digits").model().state_dict()
    weight = next(k for k, v in params.items() if v.dim() == 2 and v.shape[0] != v.shape[1])
    reshaped = {**params, weight: params[weight].reshape(params[weight].shape[::-1])}
    tampered = {k: v + 0.01 for k, v in params.items()}
    e = {v: make_entry(key, fleet_id, params, v, time.time()) for v in (1, 2, 4)}
    before = status(a)
    target = Target(a.id, f"/ip4/127.0.0.1/tcp/{a.port}")

    def counts(kind: str = "rejected") -> dict[str, int]:
        return dict(status(a)[kind])

    with hostile_peer(key, fleet_id, before["node"]["manifest_seq"], target) as h:
        # A well-behaved entry first: it is what the daemon must keep through the rest.
        r = h.offer([e[1]])
        assert r.want is not None
        assert (h.id, 1) in r.want.items
        assert r.error is None
        assert entry(status(a), h.id)["version"] == 1
        assert counts() == {}

        # Corrupt payload (one flipped byte under a valid signature): refused, session lives.
        r = h.offer([corrupt(e[2])])
        assert r.error is None
        assert counts() == {"payload_mismatch": 1}
        # Wrong shape: a transposed weight, same payload length, correctly signed.
        r = h.offer([make_entry(key, fleet_id, reshaped, 3, time.time())])
        assert counts() == {"payload_mismatch": 1, "shape_mismatch": 1}
        r = h.offer([e[4]])
        assert entry(status(a), h.id)["version"] == 4
        # Replay: version 1's exact bytes, announced as a newer version to get them asked for.
        dropped = counts("dropped").get("not_newer", 0)
        r = h.offer([e[1]], announce=[item_of(e[1], version=5)])
        assert counts("dropped").get("not_newer", 0) == dropped + 1
        assert entry(status(a), h.id)["version"] == 4
        # Garbage: a frame whose body is no message at all; the session ends with an Error.
        r = h.raw_frames([b"\xc1" * 64])
        assert r.error is not None
        assert r.error.code == "malformed"
        assert counts()["malformed"] == 1
        # A length prefix far above any limit (no body follows): the stream is cut off.
        r = h.oversize_prefix()
        assert r.hello is None
        assert r.want is None
        assert counts()["too_large"] == 1
        # A Hello claiming another member's id than the one the Noise handshake proved.
        r = h.hello_as(b.id)
        assert r.error is not None
        assert counts()["bad_signature"] == 1
        # Version 4 again with another payload: equivocation, the origin is flagged.
        r = h.offer([make_entry(key, fleet_id, tampered, 4, time.time())],
                    announce=[item_of(e[4], version=6)])
        assert counts()["equivocation"] == 1

    after = status(a)
    assert a.proc is not None
    assert a.proc.poll() is None
    assert after["rejected"] == {"payload_mismatch": 1, "shape_mismatch": 1, "malformed": 1,
                                 "too_large": 1, "bad_signature": 1, "equivocation": 1}
    assert after["flagged"] == [h.id]
    # The cache survived all of it: b's entry stays; the hostile member's last good one is
    # withdrawn with the flag (issue 24, item 3: an equivocating origin is blended no more).
    assert entry(after, b.id)["verified"] is True
    assert h.id not in {c["origin"] for c in after["cache"]}
    # And the daemon kept learning and gossiping with b meanwhile.
    wait_for(lambda: status(a)["node"]["round"] > after["node"]["round"], 30,
             "a's next round", [a])
    assert [(e["origin"], e["reason"]) for e in audit(a) if e["event"] == "withdrawn"] == [
        (h.id, "equivocation")]
    assert refused_in_audit(a, h.id, benign=True) == {
        "payload_mismatch": 1, "shape_mismatch": 1, "malformed": 1, "too_large": 1,
        "bad_signature": 1, "equivocation": 1, "not_newer": 1}
    assert refused_in_audit(a) == refused_in_audit(a, h.id)  # b was never refused


# ---------------------------------------------------------------------------- 7 outsider
def test_7_outsider_and_revoked_member_are_refused_by_reason(
    tmp_path: Path, lan: Callable[[int], list[NetnsHost]], running: list[Node]
) -> None:
    # Three members and one outsider: a valid key and the fleet's config, but not admitted.
    nodes = make_fleet(tmp_path, 4, hosts=lan(4), mdns=True, base_port=4011, learning=LIGHT,
                       admit=3)
    m0, m1, m2, outsider = nodes
    members = [m0, m1, m2]
    start(nodes, running)
    wait_ready(nodes)

    def meshed_and_outsider_refused() -> bool:
        for m in members:
            s = m.status()
            if s is None or not {o.id for o in members if o is not m} <= cached_origins(m):
                return False
            # Issue 12: the outsider's mDNS record is ignored (it is no member), so only its
            # own dials reach a member: one session on probation, refused, then closed.
            assert peer(s, outsider.id) is None, f"{m.name} lists the outsider"
            if not s["rejected"].get("not_member"):
                return False
        return True

    wait_for(meshed_and_outsider_refused, 60,
             "members to mesh and refuse the outsider", nodes)
    for m in members:
        s = status(m)
        assert outsider.id not in cached_origins(m)
        assert peer(s, outsider.id) is None  # never in a member's peer table
        assert set(s["rejected"]) == {"not_member"}
        # Every refusal (benign ones aside) is a session with the outsider, as not_member.
        assert refused_in_audit(m, outsider.id)["not_member"] >= 1
        assert refused_in_audit(m) == refused_in_audit(m, outsider.id)
        assert set(refused_in_audit(m)) == {"not_member"}
    # The outsider runs on, alone: it trains but holds nothing from the fleet.
    wait_for(lambda: status(outsider)["node"]["round"] >= 1, 60, "the outsider's first round",
             nodes)
    assert status(outsider)["cache"] == []

    # Revoke m2 and hand the newer manifest to m0 only, the way an operator would: replace
    # the manifest file its config names, and restart it.
    seq = status(m0)["node"]["manifest_seq"]
    peerd("fleet", "revoke", "--fleet", str(tmp_path / "fleet"), m2.id)
    shutil.copyfile(tmp_path / "fleet" / "manifest.peerd", m0.dir / "manifest.peerd")
    m0.stop()
    m0.start()
    t0 = time.monotonic()
    wait_for(lambda: all((m.status() or {"node": {"manifest_seq": 0}})["node"]["manifest_seq"]
                         > seq for m in (m0, m1)), 90, "the new manifest to reach m1", nodes)
    print(f"\nscenario 7: revocation reached m1 {time.monotonic() - t0:.1f} s after m0's "
          "restart")
    assert any(e["event"] == "manifest" and e["seq"] == seq + 1 for e in audit(m1))
    # m2's entry left m1's cache when the manifest was installed, counted as revoked; from
    # then on, sessions with m2 are refused (m2 may keep gossiping, it is still running).
    wait_for(lambda: m2.id not in cached_origins(m1) and m2.id not in cached_origins(m0), 30,
             "m2's entry to leave m0's and m1's caches", nodes)
    assert status(m1)["rejected"].get("revoked", 0) >= 1
    wait_for(lambda: any(e["event"] == "refused" and e["reason"] == "revoked"
                         and e["peer"] == m2.id for e in audit(m1)), 30,
             "m1 to refuse a session with m2 as revoked", nodes)
    # Refused, not re-admitted: m2's entries stay out while m2 keeps publishing.
    version = status(m2)["node"]["version"]
    wait_for(lambda: status(m2)["node"]["version"] > version + 2, 30, "m2 to publish more",
             nodes)
    assert m2.id not in cached_origins(m1)
    assert m2.id not in cached_origins(m0)


# ---------------------------------------------------------------------------- 4 capacity
# In-process in the default run (tests/daemon/test_inproc_scenarios.py): a cache's rule,
# not the network's. Here on six real daemons with `-m long`.
@pytest.mark.long
def test_4_capacity_two_keeps_only_the_two_freshest_entries(
    tmp_path: Path, running: list[Node]
) -> None:
    # Six daemons, C = 2. Three publish every round ("fresh"); three publish once and then
    # never again (ε so large that no drift exceeds it: "frozen"). Every node sees all five
    # others' entries, so once the fresh ones have published past the frozen ones, each cache
    # must hold exactly the freshest two: fresh origins only.
    nodes = make_fleet(tmp_path, 6, base_port=27400,
                       learning={**LIGHT, "capacity": 2, "round_interval_s": 2.0})
    fresh, frozen = nodes[:3], nodes[3:]
    for n in frozen:
        write_overrides(n.config, learning={"epsilon": 1e9})
    start(nodes, running)
    largest: dict[str, int] = {n.name: 0 for n in nodes}

    def poll() -> dict[str, dict[str, Any]]:
        out = {}
        for n in nodes:
            s = n.status()
            if s is not None:
                largest[n.name] = max(largest[n.name], len(s["cache"]))
                out[n.name] = s
        return out

    fresh_ids = {n.id for n in fresh}

    def settled() -> bool:
        statuses = poll()
        if len(statuses) < len(nodes):
            return False
        for n in nodes:
            origins = {c["origin"] for c in statuses[n.name]["cache"]}
            if len(origins) != 2 or not origins <= fresh_ids - {n.id}:
                return False
        return True

    wait_for(settled, 150, "every cache to hold exactly the two freshest entries", nodes)
    # It stays that way while everyone keeps gossiping (never above C, never a frozen entry).
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        statuses = poll()
        for n in nodes:
            cache = statuses[n.name]["cache"]
            assert {c["origin"] for c in cache} <= fresh_ids - {n.id}, (n.name, cache)
        time.sleep(0.5)
    assert max(largest.values()) <= 2, largest
    for n in frozen:
        s = status(n)
        assert s["node"]["version"] == 1  # trained, published once
        assert s["node"]["round"] > 3
    # The frozen entries were offered to everyone and lost on freshness, not on validity.
    for n in nodes:
        assert status(n)["rejected"] == {}


# ---------------------------------------------------------------------------- 6 partition
def test_6_partition_then_heal_entries_cross_within_30_s(
    tmp_path: Path, net: Topology, running: list[Node]
) -> None:
    # One subnet, two bridges: h0 h1 | h2 h3. Every node knows every other as a static
    # peer, so the only thing keeping the halves apart is the network.
    net.bridge("left")
    net.bridge("right")
    hosts = [net.host(f"h{i}", ("left" if i < 2 else "right", f"10.79.0.{i + 1}/24"))
             for i in range(4)]
    nodes = make_fleet(tmp_path, 4, hosts=hosts, mdns=False, base_port=4011, learning=LIGHT)
    halves = (nodes[:2], nodes[2:])
    start(nodes, running)

    def partner(n: Node) -> Node:
        half = halves[0] if n in halves[0] else halves[1]
        return next(o for o in half if o is not n)

    # The halves train apart: each node holds its partner's entry, nothing from across.
    wait_for(lambda: all(partner(n).id in cached_origins(n)
                         and (n.status() or {"node": {"round": 0}})["node"]["round"] >= 3
                         for n in nodes), STARTUP_TIMEOUT_S + 30,
             "each half to train and swap entries on its own", nodes)
    for n in nodes:
        assert cached_origins(n) == {partner(n).id}
    versions = {n.name: status(n)["node"]["version"] for n in nodes}

    # Heal: re-plug the right half into the left bridge.
    for h in hosts[2:]:
        net.move(h, "eth0", "left")
    t0 = time.monotonic()
    wait_for(lambda: all(cached_origins(n) == {o.id for o in nodes if o is not n}
                         for n in nodes), 30, "entries to cross the healed partition", nodes)
    print(f"\nscenario 6: entries crossed {time.monotonic() - t0:.1f} s after healing")
    for n in nodes:
        s = status(n)
        for o in nodes:
            if o is not n and partner(n) is not o:
                e = entry(s, o.id)
                # Trained apart, then crossed: a version published during the partition.
                assert e["verified"] is True
                assert e["version"] >= versions[o.name]
        assert s["rejected"] == {}


# ---------------------------------------------------------------------------- 3 staleness
def test_3_link_down_entries_age_out_then_flow_again(
    tmp_path: Path, lan: Callable[[int], list[NetnsHost]], running: list[Node]
) -> None:
    hosts = lan(3)
    tau = 10.0
    nodes = make_fleet(tmp_path, 3, hosts=hosts, mdns=True, base_port=4011,
                       learning={**LIGHT, "tau_max": tau})
    h, others = nodes[0], nodes[1:]
    start(nodes, running)
    wait_for(lambda: {o.id for o in others} <= cached_origins(h), STARTUP_TIMEOUT_S + 30,
             "h to hold both peers' entries", nodes)

    _ip_link(hosts[0], "down")
    t_down = time.time()
    round_down = status(h)["node"]["round"]
    # Alone, h keeps training; the peers' entries age past τ_max and are dropped.
    wait_for(lambda: not cached_origins(h) and status(h)["node"]["round"] > round_down + 3,
             tau + 30, "h's cache to empty while it keeps training", nodes)
    s = status(h)
    assert s["dropped"].get("stale", 0) >= 2
    expired = {e["origin"] for e in audit(h) if e["event"] == "expired"}
    assert {o.id for o in others} <= expired
    print(f"\nscenario 3: cache empty {time.time() - t_down:.1f} s after link down "
          f"(tau_max {tau:.0f} s)")

    _ip_link(hosts[0], "up")
    t_up = time.time()

    def fresh_again() -> bool:
        s = h.status()
        return s is not None and all(
            any(c["origin"] == o.id and c["created_at"] > t_up for c in s["cache"])
            for o in others)

    wait_for(fresh_again, 60, "entries created after the link returned to reach h", nodes)
    print(f"scenario 3: fresh entries back {time.time() - t_up:.1f} s after link up")
    assert all(entry(status(h), o.id)["verified"] for o in others)
    assert status(h)["rejected"] == {}


def _ip_link(host: NetnsHost, state: str) -> None:
    subprocess.run(["ip", "-n", host.name, "link", "set", "eth0", state], check=True,
                   timeout=10)


# ---------------------------------------------------------------------------- 5 churn
def test_5_kill_9_mid_round_resumes_without_stalling_the_others(
    tmp_path: Path, running: list[Node]
) -> None:
    # Default K (more work per round) so that a kill at an arbitrary moment likely lands
    # inside a round or a state write rather than in the sleep between rounds.
    a, b, c = make_fleet(tmp_path, 3, base_port=27500)
    start([a, b, c], running)
    wait_for(lambda: {b.id, c.id} <= cached_origins(a) and a.id in cached_origins(b),
             STARTUP_TIMEOUT_S, "a full mesh", [a, b, c])
    wait_for(lambda: status(a)["node"]["version"] >= 3, 60, "a to publish a few versions",
             [a, b, c])
    before = status(a)
    seen_by_b = entry(status(b), a.id)["version"]
    assert a.proc is not None
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(10)
    a.proc = None
    killed_at = time.monotonic()

    # While a is down (and while it restarts), b and c keep their rounds going.
    ticks: dict[str, list[tuple[float, int]]] = {b.name: [], c.name: []}

    def watching(cond: Callable[[], bool]) -> Callable[[], bool]:
        """``cond``, also recording b's and c's rounds each time it is polled."""
        def poll() -> bool:
            for n in (b, c):
                r = status(n)["node"]["round"]
                if not ticks[n.name] or ticks[n.name][-1][1] != r:
                    ticks[n.name].append((time.monotonic(), r))
            return cond()
        return poll

    wait_for(watching(lambda: time.monotonic() - killed_at > 5), 10,
             "a few seconds without a", [b, c])
    a.start()
    wait_for(watching(lambda: a.status() is not None), STARTUP_TIMEOUT_S,
             "a to come back after kill -9", [a, b, c])
    after = status(a)
    # Resumed, not restarted: round, version and cache come from disk.
    assert after["node"]["round"] >= before["node"]["round"]
    assert after["node"]["version"] >= before["node"]["version"]
    restored = [line for line in a.logs().splitlines() if "cached entries restored" in line]
    assert len(restored) == 2, restored
    assert " 2 cached entries restored (0 refused)" in restored[-1], restored
    assert not (a.dir / "quarantine").exists() or not any((a.dir / "quarantine").iterdir())
    assert "corrupt" not in a.logs()
    starts = [e for e in audit(a) if e["event"] == "start"]
    assert len(starts) == 2
    assert starts[-1]["round"] >= before["node"]["round"]

    # No version reused: a's next entries reach b as strictly newer versions, and nobody
    # sees two payloads under one version (that would be counted as equivocation).
    newest = max(seen_by_b, after["node"]["version"])
    wait_for(watching(lambda: entry(status(b), a.id)["version"] > newest), 60,
             "a's new versions to reach b", [a, b, c])
    for n in (a, b, c):
        s = status(n)
        assert s["rejected"] == {}, (n.name, s["rejected"])
        assert s["flagged"] == [], (n.name, s["flagged"])
    longest = 0.0
    for name, t in ticks.items():
        gaps = [t1 - t0 for (t0, _), (t1, _) in itertools.pairwise(t)]
        assert len(t) >= 5, (name, t)
        assert max(gaps) < 10, (name, t)
        longest = max(longest, *gaps)
    print(f"\nscenario 5: resumed at round {after['node']['round']} (killed at >= "
          f"{before['node']['round']}); others' longest gap between rounds {longest:.1f} s")


# ---------------------------------------------------------------------------- 9 learning
LEARNING_ROUNDS = 20


# In-process in the default run (tests/daemon/test_inproc_scenarios.py): what a blend
# learns, not what the network carries. Here on eight real daemons with `-m long`.
@pytest.mark.long
def test_9_mesh_learns_better_than_the_same_hosts_alone_on_non_iid_digits(
    tmp_path: Path, running: list[Node]
) -> None:
    # The same four non-IID slices twice (same seed, same node_index): once as a mesh, once
    # as four isolated daemons (their own fleets' worth of nobody: no peers, no mDNS). Both
    # groups run at once so that they share the machine's load alike.
    task = {"name": "digits", "partition": "shards", "seed": 0}
    mesh = make_fleet(tmp_path / "mesh", 4, base_port=27600, task=task)
    alone = make_fleet(tmp_path / "alone", 4, base_port=27610, task=task)
    for n in alone:
        write_overrides(n.config, network={"static_peers": []})
    nodes = mesh + alone
    start(nodes, running)
    #: node dir -> (round, val_accuracy) at the first poll that saw LEARNING_ROUNDS done
    reached: dict[Path, tuple[int, float]] = {}

    def all_reached() -> bool:
        for n in nodes:
            s = None if n.dir in reached else n.status()
            if s is not None and s["node"]["round"] >= LEARNING_ROUNDS:
                reached[n.dir] = (s["node"]["round"], s["node"]["val_accuracy"])
        return len(reached) == len(nodes)

    wait_for(all_reached, STARTUP_TIMEOUT_S + 4 * LEARNING_ROUNDS, f"{LEARNING_ROUNDS} rounds",
             nodes)
    mesh_acc = [reached[n.dir][1] for n in mesh]
    alone_acc = [reached[n.dir][1] for n in alone]
    rounds = sorted({r for r, _ in reached.values()})
    mean_mesh, mean_alone = sum(mesh_acc) / 4, sum(alone_acc) / 4
    print(f"\nscenario 9: digits, shards partition, 4 hosts, {LEARNING_ROUNDS} rounds "
          f"(read at rounds {rounds}):\n"
          f"  mesh     {' '.join(f'{a:.3f}' for a in mesh_acc)}  mean {mean_mesh:.3f}\n"
          f"  isolated {' '.join(f'{a:.3f}' for a in alone_acc)}  mean {mean_alone:.3f}")
    # The mesh actually gossiped, the isolated ones never did.
    for n in mesh:
        assert len(status(n)["cache"]) == 3
    for n in alone:
        assert status(n)["cache"] == []
        assert status(n)["peers"] == []
    assert mean_mesh > mean_alone + 0.1
