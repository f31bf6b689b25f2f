"""Re-convergence after a NAT rebinding (issue 27): how long site members behind a NAT router
take, after the router forgets every mapping (``conntrack -F``), to complete a fresh session
with the public member they bootstrapped from, and to receive a fresh entry version from it.

    sudo .venv/bin/python -m benchmarks.bench_rebinding [--repeat 5] [--sites a,b] [--no-write]
        [--render]

The set-up is tests/integration/test_wan_bootstrap.py's (tests/net/wan.py): two daemons per
site (``a``: plain MASQUERADE, ``b``: ``--random-fully``), one public member that knows nobody
and cannot dial into a site; each site member knows only the public one (``[network]
bootstrap``). Once everyone caches the public member's entry and it theirs, each repetition
flushes one site's router and times, for each of that site's members, the seconds until its
peer table counts one more completed session with the public member and until its cache holds
a newer version of the public member's entry (both read from ``peerd status --json``, polled
every :data:`POLL_S`). The target is the issue's: two round intervals (``[learning]
round_interval_s`` of the daemons' configs) plus one gossip sweep (the daemon's
``GOSSIP_INTERVAL_S``; each sweep is jittered ±50 %, the target uses the mean).

The readings (with their provenance) go to docs/reliability/nat-rebinding.json and the
section of docs/reliability.md between the ``<!-- bench:nat-rebinding -->`` markers is
rendered from them (benchmarks/docs_tables.py and tests/docs re-render and diff it).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._reconverge import GIVE_UP_S, POLL_S, ROOT, SETTLE_S, met, stop_all, summary, target

READINGS = ROOT / "docs" / "reliability" / "nat-rebinding.json"
MARK = "nat-rebinding"


def _pub_state(status: dict[str, Any] | None, pub_id: str) -> tuple[int, int]:
    """(completed sessions with the public member, newest version of its entry cached)."""
    if status is None:
        return -1, -1
    sessions = next((p["sessions"] for p in status["peers"] if p["id"] == pub_id), 0)
    version = max((c["version"] for c in status["cache"] if c["origin"] == pub_id), default=-1)
    return sessions, version


def _flush_and_time(router: Any, members: list[Any], pub_id: str) -> list[dict[str, Any]]:
    """Flush ``router``'s conntrack table; per member, seconds to its next session with the
    public member and to a newer version of its entry (None: not within GIVE_UP_S)."""
    before = {m.name: _pub_state(m.status(), pub_id) for m in members}
    subprocess.run(router.command(["conntrack", "-F"]), check=True, capture_output=True,
                   timeout=10)
    flushed = time.monotonic()
    got: dict[str, dict[str, float | None]] = {m.name: {"session_s": None, "version_s": None}
                                               for m in members}
    while time.monotonic() - flushed < GIVE_UP_S:
        for m in members:
            sessions, version = _pub_state(m.status(), pub_id)
            now = round(time.monotonic() - flushed, 2)
            mine = got[m.name]
            if mine["session_s"] is None and sessions > before[m.name][0]:
                mine["session_s"] = now
            if mine["version_s"] is None and version > before[m.name][1]:
                mine["version_s"] = now
        if all(v is not None for g in got.values() for v in g.values()):
            break
        time.sleep(POLL_S)
    return [{"member": name, **g} for name, g in got.items()]


def measure(repeat: int, sites: list[str], logs: Path | None = None) -> dict[str, Any]:
    from tests.integration.mesh import (
        STARTUP_TIMEOUT_S,
        cached_origins,
        make_fleet,
        start,
        wait_for,
        write_overrides,
    )
    from tests.net.wan import skip_reason, wan

    reason = skip_reason()
    if reason is not None:
        raise SystemExit(f"bench_rebinding: cannot build the WAN here: {reason}")
    counts = (2, 2 if "b" in sites else 0)
    with tempfile.TemporaryDirectory() as tmp, wan(counts, 1) as w:
        members_by_site = {s: w.sites[s].hosts for s in sites}
        hosts = [h for s in sites for h in members_by_site[s]]
        nodes = make_fleet(Path(tmp), len(hosts) + 1, hosts=[*hosts, w.public[0]], mdns=True,
                           base_port=4011, learning={"local_steps": 2})
        *site_nodes, pub = nodes
        for node in nodes:
            write_overrides(node.config, network={
                "mdns": True, "static_peers": [],
                "bootstrap": [] if node is pub else [pub.multiaddr()]})
            if logs is not None:  # the failed dials and stream opens are debug lines
                write_overrides(node.config, node={"log_level": "debug"})
        pub.name = "public"
        running: list[Any] = []
        try:
            start((pub, *site_nodes), running)
            wait_for(lambda: all(pub.id in cached_origins(n) and n.id in cached_origins(pub)
                                 for n in site_nodes),
                     STARTUP_TIMEOUT_S + 90, "every site member and the public one to cache "
                     "each other's entries", nodes)
            by_site, k = {}, 0
            for s in sites:
                by_site[s] = site_nodes[k:k + len(members_by_site[s])]
                for i, n in enumerate(by_site[s]):
                    n.name = f"{s}{i}"
                k += len(members_by_site[s])
            readings: dict[str, list[dict[str, Any]]] = {s: [] for s in sites}
            for rep in range(repeat):
                for s in sites:
                    for row in _flush_and_time(w.sites[s].router, by_site[s], pub.id):
                        readings[s].append({"repeat": rep, **row})
                    time.sleep(SETTLE_S)
        finally:
            stop_all(running, logs)
        return {"repeat": repeat, "sites": sites, **target(nodes), "readings": readings}


def render(r: dict[str, Any]) -> str:
    """The doc's section from one run's readings."""
    target_s = r["target_s"]
    nat = {"a": "MASQUERADE", "b": "MASQUERADE --random-fully"}
    lines = [
        "### NAT rebinding — `python -m benchmarks.bench_rebinding`",
        "",
        f"Each site's router forgot every mapping (`conntrack -F`) {r['repeat']} times; per "
        "member, the seconds until its next completed session with the public member it "
        "bootstrapped from, and until it cached a newer version of that member's entry "
        f"(status polled every {r['poll_s']} s). Target: 2 × round interval "
        f"({r['round_interval_s']:g} s) + 1 gossip sweep ({r['gossip_sweep_s']:g} s, mean) "
        f"= **{target_s:g} s**, judged on the max.",
        "",
        "| site (NAT) | member | reading | median (s) | max (s) | n | target met |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for site in r["sites"]:
        rows = r["readings"][site]
        for member in sorted({row["member"] for row in rows}):
            mine = [row for row in rows if row["member"] == member]
            for key, what in (("session_s", "fresh session"), ("version_s", "fresh entry")):
                vals = [row[key] for row in mine]
                med, top, n, _ = summary(vals, r["give_up_s"])
                lines.append(f"| {site} ({nat[site]}) | {member} | {what} | {med} | {top} | "
                             f"{n}/{len(mine)} | {met(vals, target_s)} |")
    if "provenance" in r:
        from benchmarks import _provenance

        lines += ["", _provenance.line(r["provenance"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    from benchmarks import _reconverge

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="flushes per site")
    ap.add_argument("--sites", default="a,b", help="comma list of sites to measure (a, b)")
    ap.add_argument("--logs", type=Path, help="copy each daemon's log into this folder")

    def run(args: argparse.Namespace) -> dict[str, Any]:
        sites = [s for s in args.sites.split(",") if s]
        if not sites or any(s not in ("a", "b") for s in sites):
            raise SystemExit(f"bench_rebinding: --sites takes a and/or b, not {args.sites!r}")
        return measure(args.repeat, sites, args.logs)

    _reconverge.main(ap, run, render, READINGS, MARK)


if __name__ == "__main__":
    main()
