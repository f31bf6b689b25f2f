"""Two NAT'd sites joined only by a ``peerd relay`` (issue 27): the set-up shared by
tests/integration/test_wan_relay.py and benchmarks/bench_relay_restart.py.

The relay runs in a public host's namespace (tests/net/wan.py) with its identity in a state
directory of its own, so stopping it and starting it again keeps its id and address; each
member is configured with ``[network] relays = [<that relay>]`` and nothing else across
sites (mDNS inside a site only where asked)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from peerd.mesh.netns import Host
from tests.integration.mesh import (
    PEERD,
    STARTUP_TIMEOUT_S,
    Node,
    cached_origins,
    make_fleet,
    start,
    wait_for,
    write_overrides,
)
from tests.net.wan import Wan, skip_reason

RELAY_PORT = 4011
#: A relay that has not printed its JSON line this long after it was started never will
#: (start-up is imports, key, listen: seconds on a loaded 2-core machine).
RELAY_START_TIMEOUT_S = 60.0


def start_relay(host: Host, state_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``peerd relay`` in ``host``'s namespace (its identity in ``state_dir``, so a restart
    keeps the id), once it serves: the process and its ``/ip4/…/tcp/…/p2p/<id>``. Its output
    goes to ``<state_dir>.log``, appended across restarts."""
    log = state_dir.with_suffix(".log")
    with log.open("ab") as out:
        proc = subprocess.Popen(host.command([*PEERD, "relay", "--state-dir", str(state_dir),
                                              "--port", str(RELAY_PORT), "--json"]),
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen = len(log.read_text().splitlines())
    deadline = time.monotonic() + RELAY_START_TIMEOUT_S
    while True:
        lines = [ln for ln in log.read_text().splitlines()[seen:] if ln.startswith("{")]
        if lines:
            break
        assert proc.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, "the relay did not start"
        time.sleep(0.2)
    relay_id = json.loads(lines[0])["peer_id"]
    return proc, f"/ip4/{host.address}/tcp/{RELAY_PORT}/p2p/{relay_id}"


def stop_relay(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=20)


def relay_fleet(root: Path, w: Wan, relays: str | Sequence[str], *, mdns: bool,
                debug: bool = False) -> list[Node]:
    """One member per host of each site (site a's first, then b's), named ``a0, a1, …,
    b0, …``, each knowing only the relay (or the relays) across sites."""
    relays = [relays] if isinstance(relays, str) else list(relays)
    hosts = [h for s in ("a", "b") for h in w.sites[s].hosts]
    nodes = make_fleet(root, len(hosts), hosts=hosts, mdns=mdns, base_port=4011,
                       learning={"local_steps": 2})
    names = [f"{s}{i}" for s in ("a", "b") for i in range(len(w.sites[s].hosts))]
    for node, name in zip(nodes, names, strict=True):
        node.name = name
        write_overrides(node.config, network={"mdns": mdns, "static_peers": [],
                                              "bootstrap": [], "relays": relays})
        if debug:  # the failed dials and reservations are debug lines
            write_overrides(node.config, node={"log_level": "debug"})
    return nodes


#: Every node caching every other's entry through the relay, after they all answer.
MEET_TIMEOUT_S = 180.0


def need_wan(who: str) -> None:
    """A benchmark's start: exit with why the WAN cannot be built here, if it cannot."""
    reason = skip_reason()
    if reason is not None:
        raise SystemExit(f"{who}: cannot build the WAN here: {reason}")


def meet_across(root: Path, w: Wan, relays: Sequence[str], running: list[Node], *,
                debug: bool = False) -> list[Node]:
    """The long form's fleet (two members per site, mDNS inside each site, ``relays`` only
    across), started (into ``running``, for the caller to stop) and waited for until every
    node caches every other's entry."""
    nodes = relay_fleet(root, w, relays, mdns=True, debug=debug)
    start(nodes, running)
    wait_for(lambda: all(n.status() is not None for n in nodes), STARTUP_TIMEOUT_S,
             "the daemons to answer", nodes)
    wait_for(lambda: all({o.id for o in nodes if o is not n} <= cached_origins(n)
                         for n in nodes), MEET_TIMEOUT_S,
             "every node to cache every other's entry", nodes)
    return nodes


def sessions(node: Node, peer_id: str) -> int:
    """Completed sessions ``node`` counts with ``peer_id`` (-1: it does not answer)."""
    s = node.status()
    if s is None:
        return -1
    return int(next((p["sessions"] for p in s["peers"] if p["id"] == peer_id), 0))


def peer_row(node: Node, peer_id: str) -> dict[str, Any]:
    """``node``'s status row of ``peer_id`` (empty when it does not answer or has none)."""
    s = node.status()
    row = None if s is None else next((p for p in s["peers"] if p["id"] == peer_id), None)
    return {} if row is None else dict(row)


def cross_state(status: dict[str, Any] | None, others: list[str]) -> tuple[int, dict[str, int]]:
    """(completed sessions with any of ``others``, newest cached version of each one's
    entry: -1 where none), from one status; (-1, {}) when the node did not answer."""
    if status is None:
        return -1, {}
    done = sum(p["sessions"] for p in status["peers"] if p["id"] in others)
    versions = {o: max((c["version"] for c in status["cache"] if c["origin"] == o),
                       default=-1) for o in others}
    return done, versions
