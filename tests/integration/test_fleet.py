"""A fleet converges: N real daemons in namespaces, found by mDNS alone, each ends up holding
an entry younger than τ_max from every other node, while no node starts more than ``fanout``
sessions in one gossip sweep (issue 14, item 3).

N = 6 runs in the default test command (5 peers each: more than the fanout of 3, so the bound
is at work); N = 32, `peerd demo --nodes 32`'s fleet, is marked `long` (`-m long`). What the
fleet costs (memory, CPU, mDNS packets, time to converge) is measured by
``benchmarks.bench_fleet``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from peerd.control.status import Status
from peerd.mesh.localmesh import MeshNode, local_mesh
from peerd.node.peers import DEFAULT_FANOUT
from tests.net.netns import skip_reason

pytestmark = pytest.mark.integration

#: Polling a daemon's status: the test has no event to wait on from outside the processes.
POLL_S = 1.0


def fresh_origins(s: Status, tau: float) -> set[str]:
    return {c.origin for c in s.cache if c.age_s < tau}


def done(node: MeshNode, s: Status | None, others: set[str], tau: float) -> bool:
    """A fresh entry of every other node, and every other node found by mDNS (a node can
    hold every entry before its own browser heard anyone: peers that found it dial in)."""
    return s is not None and fresh_origins(s, tau) == others and {
        p.id for p in s.peers if p.source == "mdns"} == others


def wait_converged(mesh: list[MeshNode], tau: float, timeout_s: float) -> list[Status]:
    """Every node's statuses once each holds a fresh entry of every other node (C = N − 1,
    so min(C, N − 1) = N − 1 entries) and has found every other node by mDNS; fails with the
    laggards' log tails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    ids = {n.id for n in mesh}
    statuses: list[Status | None] = []
    while time.monotonic() < deadline:
        statuses = [n.poll() for n in mesh]
        if all(done(n, s, ids - {n.id}, tau) for n, s in zip(mesh, statuses, strict=True)):
            return [s for s in statuses if s is not None]
        for n in mesh:
            assert n.alive(), f"node{n.index} exited ({n.exit_code()}):\n" + "\n".join(n.tail(40))
        time.sleep(POLL_S)
    lagging = [n for n, s in zip(mesh, statuses, strict=True)
               if not done(n, s, ids - {n.id}, tau)]
    held = {n.index: None if s is None else (len(fresh_origins(s, tau)),
                                             sum(p.source == "mdns" for p in s.peers))
            for n, s in zip(mesh, statuses, strict=True)}
    logs = "\n".join(f"--- node{n.index}\n" + "\n".join(n.tail(20)) for n in lagging[:3])
    raise AssertionError(f"not converged in {timeout_s:.0f} s; (fresh entries, peers found by "
                         f"mDNS) per node: {held}\n"
                         f"{logs}")


def converge(tmp_path: Path, n: int, round_interval: float, timeout_s: float) -> None:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    tau = max(60.0, 6 * round_interval)
    learning: dict[str, object] = {"round_interval_s": round_interval, "tau_max": tau}
    with local_mesh(tmp_path, n, use_netns=True, learning=learning) as mesh:
        statuses = wait_converged(mesh, tau, timeout_s)
    for s in statuses:
        assert s.node.published_version is not None
        gossip = s.gossip
        assert gossip["sweeps"] > 0
        assert gossip["dials"] > 0
        # The bound itself: a sweep never starts more than fanout sessions (without it, a
        # sweep with all n − 1 > fanout peers due would start n − 1).
        assert 0 < gossip["most_dials_in_a_sweep"] <= DEFAULT_FANOUT
        # ... and never more than fanout of its own sessions at once (wake-ups between sweeps
        # used to pile slow sessions up: 31 at once in a fleet of 32).
        assert 0 < gossip["most_outbound_at_once"] <= DEFAULT_FANOUT


def test_six_daemons_converge_by_mdns_within_the_fanout(tmp_path: Path) -> None:
    # 6 daemons importing torch on a shared 2-core machine, then mDNS and a few sweeps.
    converge(tmp_path, 6, round_interval=2.0, timeout_s=240.0)


@pytest.mark.long
def test_thirty_two_daemons_converge_by_mdns_within_the_fanout(tmp_path: Path) -> None:
    # 32 start-ups share 2 cores (~4 s of CPU each), then 31 entries reach every node.
    converge(tmp_path, 32, round_interval=10.0, timeout_s=900.0)
