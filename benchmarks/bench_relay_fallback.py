"""Fallback to a second relay (issue 27, relay loss): how long members of two NAT'd sites,
configured with ``[network] relays = [r1, r2]``, take after r1 is killed (SIGKILL: its
reservations, registrations and circuits gone, r2 untouched) to complete a fresh cross-site
session and to cache fresh versions of the other site's entries — through r2 only.

    sudo .venv/bin/python -m benchmarks.bench_relay_fallback [--repeat 5] [--no-write]
        [--render] [--logs DIR]

The set-up is bench_relay_restart's (tests/integration/relay_sites.py), with a second relay
on a second public host. Once every node caches every other's entry and holds reservations
at both relays (from each member's log), each repetition kills r1 and records, per member,
the seconds from the kill (the old process reaped) until its peer table counts one more
completed session with a member of the other site, and until its cache holds a newer
version of both other-site members' entries than once r1 had exited (``peerd status
--json``, polled every POLL_S). r1 is then started again (same key and port) and the next
repetition waits until every member holds its reservation there again. The target is the
issue's: two round intervals plus one gossip sweep (benchmarks/_reconverge.py).

The readings go to docs/reliability/relay-fallback.json and the section of
docs/reliability.md between the ``<!-- bench:relay-fallback -->`` markers is rendered from
them (benchmarks/docs_tables.py and tests/docs re-render and diff it).
"""

from __future__ import annotations

import tempfile
import time
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
    target,
    target_text,
)
from benchmarks.bench_relay_restart import _reserved_at, other_site, time_cross_site

READINGS = ROOT / "docs" / "reliability" / "relay-fallback.json"
MARK = "relay-fallback"


def _wait_reserved(members: list[Any], addr: str, after: float) -> None:
    deadline = time.monotonic() + GIVE_UP_S
    while not all(_reserved_at(m.log, addr, after) is not None for m in members):
        assert time.monotonic() < deadline, f"not every member reserved at {addr} again"
        time.sleep(POLL_S)


def _kill_and_time(proc: Any, members: list[Any]) -> dict[str, Any]:
    """Kill r1 (``proc``); per member session_s and version_s (None: not within GIVE_UP_S)."""
    from tests.integration.relay_sites import cross_state

    proc.kill()
    proc.wait(timeout=20)
    killed = time.monotonic()
    # Read once r1 has exited: what is counted after this came through r2.
    before = {m.name: cross_state(m.status(), other_site(m, members)) for m in members}
    got = time_cross_site(members, before, killed)
    return {"members": [{"member": name, **g} for name, g in got.items()]}


def measure(repeat: int, logs: Path | None = None) -> dict[str, Any]:
    from tests.integration.relay_sites import meet_across, need_wan, start_relay, stop_relay
    from tests.net.wan import wan

    need_wan("bench_relay_fallback")
    with tempfile.TemporaryDirectory() as tmp, wan((2, 2), 2) as w:
        dirs = [Path(tmp) / "relay1", Path(tmp) / "relay2"]
        r1, addr1 = start_relay(w.public[0], dirs[0])
        r2, addr2 = start_relay(w.public[1], dirs[1])
        running: list[Any] = []
        try:
            t0 = started = time.time()
            nodes = meet_across(Path(tmp), w, [addr1, addr2], running, debug=logs is not None)
            fields = target(nodes)  # read while the configs exist
            readings: list[dict[str, Any]] = []
            for rep in range(repeat):
                # r1's reservations made anew since its restart; r2's are held throughout.
                _wait_reserved(nodes, addr1, t0)
                _wait_reserved(nodes, addr2, started)
                row = _kill_and_time(r1, nodes)
                readings.append({"repeat": rep, **row})
                t0 = time.time()
                r1, again = start_relay(w.public[0], dirs[0])
                assert again == addr1, f"r1 came back as {again}, not {addr1}"
                time.sleep(SETTLE_S)
        finally:
            stop_all(running, logs, *(d.with_suffix(".log") for d in dirs))
            stop_relay(r1)
            stop_relay(r2)
    return {"repeat": repeat, **fields, "readings": readings}


def render(r: dict[str, Any]) -> str:
    """The doc's section from one run's readings."""
    lines = [
        "### Fallback to a second relay — `python -m benchmarks.bench_relay_fallback`",
        "",
        f"Members configured with two relays; the first was killed (SIGKILL) {r['repeat']} "
        f"time{'' if r['repeat'] == 1 else 's'}, once every member held reservations at "
        "both (and started again before the next repetition); per member, the seconds "
        "from the kill until its next completed session with a member of the other site, "
        "and until it cached a newer version of both other-site members' entries (status "
        f"polled every {r['poll_s']} s). {target_text(r)}",
        "",
        *MEMBER_TABLE,
    ]
    lines += member_rows(r, (("session_s", "fresh cross-site session", True),
                             ("version_s", "fresh cross-site entries", True)))
    lines += provenance_tail(r)
    return "\n".join(lines) + "\n"


def main() -> None:
    cli(__doc__, measure, render, READINGS, MARK, "kills of the first relay")


if __name__ == "__main__":
    main()
