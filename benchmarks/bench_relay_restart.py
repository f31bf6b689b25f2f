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

import re
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks._reconverge import (
    GIVE_UP_S,
    MEMBER_TABLE,
    POLL_S,
    ROOT,
    SETTLE_S,
    cli,
    member_rows,
    provenance_tail,
    stop_all,
    summary,
    target,
    target_text,
)

READINGS = ROOT / "docs" / "reliability" / "relay-restart.json"
MARK = "relay-restart"
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


def other_site(member: Any, members: list[Any]) -> list[str]:
    """The ids of the other site's members (relay_fleet names them by site: "a0", "b1")."""
    return [o.id for o in members if o.name[0] != member.name[0]]


def time_cross_site(members: list[Any], before: dict[str, tuple[int, dict[str, int]]],
                    since: float) -> dict[str, dict[str, float | None]]:
    """Per member, the seconds from ``since`` (monotonic) until its next completed session
    with the other site and until it caches a newer version of both other-site members'
    entries than in ``before`` (relay_sites.cross_state); None: not within GIVE_UP_S."""
    from tests.integration.relay_sites import cross_state

    got: dict[str, dict[str, float | None]] = {m.name: {"session_s": None, "version_s": None}
                                               for m in members}
    while time.monotonic() - since < GIVE_UP_S:
        for m in members:
            others = other_site(m, members)
            done, versions = cross_state(m.status(), others)
            now = round(time.monotonic() - since, 2)
            mine, (done0, versions0) = got[m.name], before[m.name]
            if mine["session_s"] is None and done > done0:
                mine["session_s"] = now
            if mine["version_s"] is None and versions and all(
                    versions[o] > versions0.get(o, -1) for o in others):
                mine["version_s"] = now
        if all(v is not None for g in got.values() for v in g.values()):
            break
        time.sleep(POLL_S)
    return got


def _restart_and_time(w: Any, state_dir: Path, proc: Any, addr: str,
                      members: list[Any]) -> tuple[Any, dict[str, Any]]:
    """Stop the relay ``proc`` and start it again; the new process and this repetition's
    readings (down_s; per member session_s and version_s, None: not within GIVE_UP_S)."""
    from tests.integration.relay_sites import cross_state, start_relay, stop_relay

    stopped, stopped_wall = time.monotonic(), time.time()
    stop_relay(proc)
    # Read once the old process has exited: no circuit is left, so nothing counted after this
    # can have come through the old relay (read before the stop, a session completing while
    # it shut down would count as fresh).
    before = {m.name: cross_state(m.status(), other_site(m, members)) for m in members}
    proc, again = start_relay(w.public[0], state_dir)
    restarted, restarted_wall = time.monotonic(), time.time()
    assert again == addr, f"the relay came back as {again}, not {addr}"
    got = time_cross_site(members, before, restarted)
    # When each member held a reservation again, from its log (no status field says it):
    # what the relay client's retry backoff adds before any circuit can be dialled.
    for m in members:
        at = _reserved_at(m.log, addr, stopped_wall)
        got[m.name]["reserved_s"] = None if at is None else round(at - restarted_wall, 2)
    return proc, {"down_s": round(restarted - stopped, 2),
                  "members": [{"member": name, **g} for name, g in got.items()]}


def measure(repeat: int, logs: Path | None = None) -> dict[str, Any]:
    from tests.integration.relay_sites import meet_across, need_wan, start_relay, stop_relay
    from tests.net.wan import wan

    need_wan("bench_relay_restart")
    with tempfile.TemporaryDirectory() as tmp, wan((2, 2), 1) as w:
        state_dir = Path(tmp) / "relay"
        proc, addr = start_relay(w.public[0], state_dir)
        running: list[Any] = []
        try:
            nodes = meet_across(Path(tmp), w, [addr], running, debug=logs is not None)
            fields = target(nodes)  # read while the configs exist
            readings: list[dict[str, Any]] = []
            for rep in range(repeat):
                proc, row = _restart_and_time(w, state_dir, proc, addr, nodes)
                readings.append({"repeat": rep, **row})
                time.sleep(SETTLE_S)
        finally:
            stop_all(running, logs, state_dir.with_suffix(".log"))
            stop_relay(proc)
    return {"repeat": repeat, **fields, "readings": readings}


def render(r: dict[str, Any]) -> str:
    """The doc's section from one run's readings."""
    give_up = r["give_up_s"]
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
        f"(status polled every {r['poll_s']} s){reserved}. {target_text(r)}",
        "",
        *MEMBER_TABLE,
    ]
    down = [row["down_s"] for row in rows]
    med, top, n, _ = summary(down, give_up)
    lines.append(f"| (relay) | down | {med} | {top} | {n}/{len(rows)} | – |")
    # "reservation held again" is a part of the time, not a target of its own.
    lines += member_rows(r, (("reserved_s", "reservation held again", False),
                             ("session_s", "fresh cross-site session", True),
                             ("version_s", "fresh cross-site entries", True)))
    lines += provenance_tail(r)
    return "\n".join(lines) + "\n"


def main() -> None:
    cli(__doc__, measure, render, READINGS, MARK, "relay restarts")


if __name__ == "__main__":
    main()
