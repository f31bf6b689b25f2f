"""A quiet node stays in the fleet (issue 12, item 3): with ε so large that no round ever
moves the model far enough to publish, the node still republishes every ``max_silence_s``,
so a peer keeps a fresh copy of it for longer than τ_max, instead of dropping it as stale.
Two real daemons on loopback (static peers, no mDNS)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration.mesh import (
    STARTUP_TIMEOUT_S,
    Node,
    cached_origins,
    make_fleet,
    start,
    status,
    wait_for,
)

#: τ_max well above a republish's worst delay at a peer: max_silence_s, one round interval,
#: a gossip sweep (up to 4.5 s) and the session, on a loaded 2-core machine.
TAU_MAX_S = 15.0
MAX_SILENCE_S = 3.0
#: How long the peer is watched: more than twice τ_max, so the first entry would have expired.
WATCH_S = 2.5 * TAU_MAX_S


def test_a_node_below_epsilon_republishes_and_stays_cached_past_tau_max(
    tmp_path: Path, running: list[Node]
) -> None:
    quiet, peer = make_fleet(tmp_path, 2, base_port=27730, learning={
        "local_steps": 3, "tau_max": TAU_MAX_S, "max_silence_s": MAX_SILENCE_S,
        "epsilon": 1e9,  # no model ever moves this far: every publication after the first
    })                   # is one for silence
    start((quiet, peer), running)
    wait_for(lambda: quiet.id in cached_origins(peer), STARTUP_TIMEOUT_S + 30,
             "the peer to cache the quiet node's first entry", [quiet, peer])
    first = next(c for c in (peer.status() or {})["cache"] if c["origin"] == quiet.id)

    # Before the fix the quiet node published only that first entry: the peer dropped it
    # τ_max after its created_at, within this window, and never fetched another.
    seen_versions: set[int] = set()
    deadline = time.monotonic() + WATCH_S
    while time.monotonic() < deadline:
        s = status(peer)
        held = [c for c in s["cache"] if c["origin"] == quiet.id]
        assert held, (f"the peer dropped the quiet node (dropped: {s['dropped']})\n"
                      f"{quiet.logs()[-3000:]}")
        assert held[0]["age_s"] < TAU_MAX_S
        seen_versions.add(held[0]["version"])
        time.sleep(0.5)
    final = status(peer)
    last = next(c for c in final["cache"] if c["origin"] == quiet.id)
    assert last["created_at"] > first["created_at"] + TAU_MAX_S  # a copy made after τ_max
    assert last["verified"] is True
    # Every ~max_silence_s a new version, each one re-signed (not the old one relayed).
    assert len(seen_versions) >= WATCH_S / (4 * MAX_SILENCE_S), seen_versions
    s = status(quiet)
    assert s["node"]["version"] >= last["version"]
    assert "republishing" in quiet.logs()
    assert final["dropped"].get("stale", 0) == 0  # the quiet node's entries never expired
