"""Stranger churn against a real daemon (issue 24, item 1), on loopback.

About 1,000 fresh libp2p identities, each dialling once, saying Hello and reading the
``not_member`` refusal, used to stop ``peerd run`` (py-libp2p's peerstore evicted the host's
own entry and its identify handler raised ``PeerStoreError`` out of the swarm). Here
``CI_STRANGERS`` of them churn through a daemon (the benchmark
``benchmarks/bench_churn.py`` runs 5,000): it must stay up, keep training, keep serving a
member (whose first session completes quickly), and hold py-libp2p's per-peer tables, its
memory and its file descriptors within the bounds below.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from peerd.net.transport_config import MAX_PROBATION_CONNECTIONS
from peerd.store.keyfile import read_private_key
from tests.integration.hostile import Target, hostile_peer
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
from tests.integration.soak_metrics import open_fds, rss_mb
from tests.net.churn import churn_in_thread

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The issue's short form for CI (the crash came after 1,019 to ~1,650 strangers).
CI_STRANGERS = 1_500
#: Bounds after the churn, against the daemon before it (the same process, warmed up by a
#: few rounds and a first flood of strangers). py-libp2p leaks ~15 KB per connection in
#: its own bookkeeping (docs/transport.md, defect 1): 1,500 of them are ~22 MB at most.
#: Measured here: see docs/reliability.md "Stranger churn".
MAX_RSS_GROWTH_MB = 20.0
MAX_FD_GROWTH = 16
#: What py-libp2p may hold per peer once the strangers are gone: the member, the host
#: itself and the few outsiders on probation at the moment, never one per stranger.
MAX_LIBRARY_PEERS_AFTER = 2 + MAX_PROBATION_CONNECTIONS
#: A member's session (dial, handshake, Hello, Digest, entries) once the churn is over.
MAX_MEMBER_SESSION_S = 2.0
LIGHT = {"local_steps": 3}


def test_a_churn_of_strangers_neither_stops_nor_bloats_the_daemon(
    tmp_path: Path, running: list[Node]
) -> None:
    a, b = make_fleet(tmp_path, 2, base_port=27460, learning=LIGHT)
    write_overrides(a.config, network={"static_peers": []})  # b dials a, not the other way
    start((a,), running)
    wait_for(lambda: (a.status() or {}).get("node", {}).get("published_version") is not None,
             STARTUP_TIMEOUT_S, "a to publish", [a])
    fleet = bytes.fromhex(status(a)["node"]["fleet"])
    target = f"/ip4/127.0.0.1/tcp/{a.port}"
    assert a.proc is not None
    pid = a.proc.pid

    warm = churn_in_thread(fleet, a.id, target, 100)  # allocator and caches warmed up
    assert warm.outcomes["error not_member"] > 0, warm.outcomes
    before = status(a)
    rss0, fds0 = rss_mb(pid), open_fds(pid)
    assert rss0 is not None
    assert fds0 is not None

    seen = churn_in_thread(fleet, a.id, target, CI_STRANGERS)
    print(f"\n{seen.visits} strangers in {seen.seconds:.0f} s: {dict(seen.outcomes)}")
    assert a.alive(), a.logs()[-3000:]
    # Every stranger met the daemon: refused in a session, or its connection closed.
    assert seen.outcomes["error not_member"] >= CI_STRANGERS // 10, seen.outcomes
    assert not {k for k in seen.outcomes if k.startswith("error ")} - {"error not_member"}

    after = status(a)
    assert after["node"]["round"] > before["node"]["round"]  # it kept training
    assert after["rejected"].get("not_member", 0) >= before["rejected"].get("not_member", 0)
    lib = after["libp2p"]
    assert lib["handler_errors"] == 0, lib
    # The library forgot every stranger: its tables hold what is connected now.
    wait_for(lambda: status(a)["libp2p"]["peerstore"] <= MAX_LIBRARY_PEERS_AFTER, 15,
             "py-libp2p's peerstore to forget the strangers", [a])
    lib = status(a)["libp2p"]
    assert lib["per_peer_entries"] <= 8 * MAX_LIBRARY_PEERS_AFTER, lib
    assert lib["forgotten"] >= CI_STRANGERS // 2, lib
    rss1, fds1 = rss_mb(pid), open_fds(pid)
    assert rss1 is not None
    assert fds1 is not None
    print(f"rss {rss0:.1f} -> {rss1:.1f} MB, fds {fds0} -> {fds1}, libp2p {lib}")
    assert rss1 - rss0 <= MAX_RSS_GROWTH_MB, (rss0, rss1)
    assert fds1 - fds0 <= MAX_FD_GROWTH, (fds0, fds1)

    # A member's session (over a fresh dial) completes quickly, and a member daemon gets in.
    seq = after["node"]["manifest_seq"]
    with hostile_peer(read_private_key(b.dir / "node.key"), fleet, seq,
                      Target(a.id, target)) as member:
        t0 = time.monotonic()
        reply = member.offer([])
        session_s = time.monotonic() - t0
    assert reply.error is None, reply
    assert reply.want is not None, reply
    print(f"a member's session after the churn: {session_s:.2f} s")
    assert session_s < MAX_MEMBER_SESSION_S
    start((b,), running)
    wait_for(lambda: a.id in cached_origins(b), STARTUP_TIMEOUT_S,
             "b to start and cache a's entry", [a, b])
    assert a.alive()
