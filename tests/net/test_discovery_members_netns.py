"""Discovery takes members only and honours goodbyes, over real multicast between
namespaces (issue 12, item 12): separate processes on a private bridge."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.net.netns import NetnsHost
from tests.net.test_discovery_netns import SCENARIO_TIMEOUT_S, _finish, _seed_and_id, _start

WATCH = str(Path(__file__).with_name("mdns_watch.py"))


def _read_until(p: subprocess.Popen[str], want: Callable[[dict[str, Any]], bool]
                ) -> list[dict[str, Any]]:
    """``p``'s JSON lines up to the first one ``want``s (its own --deadline bounds this)."""
    assert p.stdout is not None
    events: list[dict[str, Any]] = []
    for line in p.stdout:
        if line.startswith("{"):
            events.append(json.loads(line))
            if want(events[-1]) or events[-1]["event"] == "done":
                return events
    raise AssertionError(f"ended early: {events}; {p.stderr.read() if p.stderr else ''}")


def test_a_non_members_record_is_ignored_and_a_goodbye_forgets_the_member(
    lan: Callable[[int], list[NetnsHost]],
) -> None:
    h_w, h_m, h_x = lan(3)
    (seed_w, _), (seed_m, id_m), (seed_x, id_x) = (_seed_and_id() for _ in range(3))
    procs: list[subprocess.Popen[str]] = []
    try:
        # m is a member, x holds the fleet id (public) but is none; both advertise.
        m = _start(h_m, "--seed", seed_m, "--fleet", "fleet-x", "--iface", "eth0",
                   "--until-eof", "--deadline", str(SCENARIO_TIMEOUT_S))
        procs.append(m)
        x = _start(h_x, "--seed", seed_x, "--fleet", "fleet-x", "--iface", "eth0",
                   "--until-eof", "--deadline", str(SCENARIO_TIMEOUT_S))
        procs.append(x)
        w = subprocess.Popen(
            h_w.python(WATCH, "--seed", seed_w, "--fleet", "fleet-x", "--iface", "eth0",
                       "--member", id_m, "--until-lost", id_m, "--expect-not-member", "1",
                       "--deadline", str(SCENARIO_TIMEOUT_S)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=Path(__file__).parents[2])
        procs.append(w)
        before = _read_until(w, lambda e: e["event"] == "peer")
        assert [e["id"] for e in before if e["event"] == "peer"] == [id_m]
        # m leaves the way a daemon stops: goodbye packets (TTL 0) on its way out.
        _finish(m)
        out, err = w.communicate(timeout=SCENARIO_TIMEOUT_S)
        assert w.returncode == 0, err[-3000:]
        events = before + [json.loads(line) for line in out.splitlines()
                           if line.startswith("{")]
        _finish(x)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    done = events[-1]
    assert done["event"] == "done", events
    # Lost by its goodbye, within the run (its records would expire after minutes).
    assert done["lost"] == [id_m]
    assert id_x not in done["found"]  # the non-member's record never became a hint
    assert set(done["found"]) == {id_m}
    assert done["rejected"].get("not_member", 0) >= 1
