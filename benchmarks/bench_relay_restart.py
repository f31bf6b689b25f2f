"""Re-convergence after a relay restart (issue 27): how long members of two NAT'd sites,
joined only by a ``peerd relay``, take after the relay is stopped and started again (same
key, same port: every reservation, rendezvous registration and circuit gone) to complete a
fresh cross-site session and to cache fresh versions of the other site's entries.

    sudo .venv/bin/python -m benchmarks.bench_relay_restart [--repeat 5] [--no-write]
        [--render] [--logs DIR]

The set-up is the long form of tests/integration/test_wan_relay.py (its helpers,
tests/integration/relay_sites.py): two members per site of tests/net/wan.py (``a``: plain
MASQUERADE, ``b``: ``--random-fully``; neither router lets a connection in), mDNS inside each
site and nothing across it but ``[network] relays = [<the relay on the public segment>]``.
Once every node caches every other's entry, each repetition stops the relay (SIGTERM, reaped)
and starts it again, and records the seconds it was down (from the stop until the new process
prints that it serves) and, for each member, the seconds from the restart until its peer
table counts one more completed session with a member of the other site, and until its cache
holds a newer version of *both* other-site members' entries than it held once the old
relay process had exited (read from ``peerd status --json``, polled every :data:`POLL_S`),
and, from the member's log, until its relay client held a reservation again. The target is the issue's, computed as in
bench_rebinding: two round intervals (``[learning] round_interval_s`` of the daemons'
configs) plus one gossip sweep (the daemon's ``GOSSIP_INTERVAL_S``, the mean of its jitter).

The readings (with their provenance) go to docs/reliability/relay-restart.json and the
section of docs/reliability.md between the ``<!-- bench:relay-restart -->`` markers is
rendered from them (benchmarks/docs_tables.py and tests/docs re-render and diff it).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import statistics
import tempfile
import time
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
READINGS = ROOT / "docs" / "reliability" / "relay-restart.json"
RELIABILITY = ROOT / "docs" / "reliability.md"
MARK = "relay-restart"
#: How often each member's status is read while waiting (the readings' resolution).
POLL_S = 0.2
#: A member not re-converged this long after a restart is recorded as not re-converged (None).
GIVE_UP_S = 60.0
#: Pause between a repetition's re-convergence and the next stop (connections settle).
SETTLE_S = 3.0
#: Every node caching every other's entry through the relay, after they all answer.
MEET_TIMEOUT_S = 180.0
#: The relay client's line when it holds a reservation (peerd/net/relayclient.py), after the
#: daemon's log format's asctime (cli/run.py: local time, milliseconds).
RESERVED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO "
                      r"peerd\.net\.relayclient: relay (\S+): reservation held")


def _reserved_at(log: Path, addr: str, after: float) -> float | None:
    """Wall time of the first reservation at ``addr`` that ``log`` records after ``after``."""
    for line in log.read_text(errors="replace").splitlines():
        m = RESERVED.match(line)
        if m is None or m.group(2) != addr:
            continue
        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if at >= after:
            return at
    return None


def _restart_and_time(w: Any, state_dir: Path, proc: Any, addr: str,
                      members: list[Any]) -> tuple[Any, dict[str, Any]]:
    """Stop the relay ``proc`` and start it again; the new process and this repetition's
    readings (down_s; per member session_s and version_s, None: not within GIVE_UP_S)."""
    from tests.integration.relay_sites import cross_state, start_relay, stop_relay

    # relay_fleet names members by site ("a0", "b1"): the other site is the other letter.
    other = {m.name: [o.id for o in members if o.name[0] != m.name[0]] for m in members}
    stopped, stopped_wall = time.monotonic(), time.time()
    stop_relay(proc)
    # Read once the old process has exited: no circuit is left, so nothing counted after this
    # can have come through the old relay (read before the stop, a session completing while
    # it shut down would count as fresh).
    before = {m.name: cross_state(m.status(), other[m.name]) for m in members}
    proc, again = start_relay(w.public[0], state_dir)
    restarted, restarted_wall = time.monotonic(), time.time()
    assert again == addr, f"the relay came back as {again}, not {addr}"
    got: dict[str, dict[str, float | None]] = {m.name: {"session_s": None, "version_s": None}
                                               for m in members}
    while time.monotonic() - restarted < GIVE_UP_S:
        for m in members:
            done, versions = cross_state(m.status(), other[m.name])
            now = round(time.monotonic() - restarted, 2)
            mine, (done0, versions0) = got[m.name], before[m.name]
            if mine["session_s"] is None and done > done0:
                mine["session_s"] = now
            if mine["version_s"] is None and versions and all(
                    versions[o] > versions0.get(o, -1) for o in other[m.name]):
                mine["version_s"] = now
        if all(g["session_s"] is not None and g["version_s"] is not None
               for g in got.values()):
            break
        time.sleep(POLL_S)
    # When each member held a reservation again, from its log (no status field says it):
    # what the relay client's retry backoff adds before any circuit can be dialled.
    for m in members:
        at = _reserved_at(m.log, addr, stopped_wall)
        got[m.name]["reserved_s"] = None if at is None else round(at - restarted_wall, 2)
    return proc, {"down_s": round(restarted - stopped, 2),
                  "members": [{"member": name, **g} for name, g in got.items()]}


def measure(repeat: int, logs: Path | None = None) -> dict[str, Any]:
    from peerd.daemon.gossiping import GOSSIP_INTERVAL_S
    from tests.integration.mesh import (
        STARTUP_TIMEOUT_S,
        cached_origins,
        start,
        wait_for,
    )
    from tests.integration.relay_sites import relay_fleet, start_relay, stop_relay
    from tests.net.wan import skip_reason, wan

    reason = skip_reason()
    if reason is not None:
        raise SystemExit(f"bench_relay_restart: cannot build the WAN here: {reason}")
    with tempfile.TemporaryDirectory() as tmp, wan((2, 2), 1) as w:
        state_dir = Path(tmp) / "relay"
        proc, addr = start_relay(w.public[0], state_dir)
        running: list[Any] = []
        try:
            nodes = relay_fleet(Path(tmp), w, addr, mdns=True, debug=logs is not None)
            start(nodes, running)
            wait_for(lambda: all(n.status() is not None for n in nodes), STARTUP_TIMEOUT_S,
                     "the daemons to answer", nodes)
            wait_for(lambda: all({o.id for o in nodes if o is not n} <= cached_origins(n)
                                 for n in nodes), MEET_TIMEOUT_S,
                     "every node to cache every other's entry", nodes)
            rounds = {tomllib.loads(n.config.read_text())["learning"]["round_interval_s"]
                      for n in nodes}
            readings: list[dict[str, Any]] = []
            for rep in range(repeat):
                proc, row = _restart_and_time(w, state_dir, proc, addr, nodes)
                readings.append({"repeat": rep, **row})
                time.sleep(SETTLE_S)
        finally:
            for node in running:
                if node.proc is not None and node.proc.poll() is None:
                    node.proc.send_signal(signal.SIGTERM)
            for node in running:
                node.stop()
            stop_relay(proc)
            if logs is not None:  # what each daemon said, for reading why a restart took long
                logs.mkdir(parents=True, exist_ok=True)
                for node in running:
                    shutil.copy(node.log, logs / f"{node.name}.log")
                shutil.copy(Path(tmp) / "relay.log", logs / "relay.log")
    assert len(rounds) == 1, f"the daemons' round intervals differ: {rounds}"
    round_s = rounds.pop()
    return {"repeat": repeat, "round_interval_s": round_s, "gossip_sweep_s": GOSSIP_INTERVAL_S,
            "target_s": 2 * round_s + GOSSIP_INTERVAL_S, "poll_s": POLL_S,
            "give_up_s": GIVE_UP_S, "readings": readings}


def _summary(values: list[float | None], give_up: float) -> tuple[str, str, int, bool]:
    """(median, max, n re-converged, all re-converged) as text; a miss counts as give_up."""
    done = [v for v in values if v is not None]
    if not values:
        return "–", "–", 0, False
    worst = [v if v is not None else give_up for v in values]
    top_s = f"{max(worst):.1f}" if len(done) == len(values) else f"> {give_up:.0f}"
    return f"{statistics.median(worst):.1f}", top_s, len(done), len(done) == len(values)


def render(r: dict[str, Any]) -> str:
    """The doc's section from one run's readings."""
    target, give_up = r["target_s"], r["give_up_s"]
    rows = r["readings"]
    reserved = ("; \"reservation held again\" is read from the member's log (its relay "
                "client's line)") if all("reserved_s" in m for row in rows
                                         for m in row["members"]) else ""
    lines = [
        "### Relay restart — `python -m benchmarks.bench_relay_restart`",
        "",
        f"The relay was stopped and started again (same key and port) {r['repeat']} time{'' if r['repeat'] == 1 else 's'}, "
        "once every node cached every other's entry; per repetition, the seconds it was "
        "down (stop until the new process serves) and, per member, the seconds from its "
        "restart until the member's next completed session with a member of the other "
        "site, and until it cached a newer version of both other-site members' entries "
        f"(status polled every {r['poll_s']} s){reserved}. Target: 2 × round interval "
        f"({r['round_interval_s']:g} s) + 1 gossip sweep ({r['gossip_sweep_s']:g} s, mean) "
        f"= **{target:g} s**, judged on the max.",
        "",
        "| member | reading | median (s) | max (s) | n | target met |",
        "|---|---|---:|---:|---:|---|",
    ]
    down = [row["down_s"] for row in rows]
    med, top, n, _ = _summary(down, give_up)
    lines.append(f"| (relay) | down | {med} | {top} | {n}/{len(rows)} | – |")
    members = sorted({m["member"] for row in rows for m in row["members"]})
    for member in members:
        mine = [m for row in rows for m in row["members"] if m["member"] == member]
        for key, what in (("reserved_s", "reservation held again"),
                          ("session_s", "fresh cross-site session"),
                          ("version_s", "fresh cross-site entries")):
            if any(key not in m for m in mine):  # readings made before it was recorded
                continue
            vals = [m[key] for m in mine]
            med, top, n, complete = _summary(vals, give_up)
            if key == "reserved_s":  # a part of the time, not a target of its own
                verdict = "–"
            else:
                met = complete and max(v for v in vals if v is not None) <= target
                verdict = "met" if met else "not met"
            lines.append(f"| {member} | {what} | {med} | {top} | {n}/{len(mine)} | "
                         f"{verdict} |")
    if "provenance" in r:
        from benchmarks import _provenance

        lines += ["", _provenance.line(r["provenance"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    from benchmarks import _provenance
    from benchmarks._report import write_section

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="relay restarts")
    ap.add_argument("--logs", type=Path, help="copy each daemon's and the relay's log here")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--render", action="store_true",
                    help="measure nothing: rewrite the section from the committed readings")
    args = ap.parse_args()
    if args.render:
        write_section(MARK, render(json.loads(READINGS.read_text())), RELIABILITY)
        return
    if args.repeat < 1:
        raise SystemExit(f"bench_relay_restart: --repeat takes 1 or more, not {args.repeat}")
    started = _provenance.start(ap, args)
    r = measure(args.repeat, args.logs)
    r["provenance"] = started.record()
    md = render(r)
    print(md)
    if not args.no_write:
        READINGS.write_text(json.dumps(r, indent=1) + "\n")
        write_section(MARK, md, RELIABILITY)


if __name__ == "__main__":
    main()
