"""Discovery takes members only and honours goodbyes, over real multicast between
namespaces (issue 12, item 12): separate processes on a private bridge."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.net.mdns_procs import (
    REPO,
    SCENARIO_TIMEOUT_S,
    finish,
    processes,
    read_until,
    seed_and_id,
    start_node,
)
from tests.net.netns import NetnsHost

WATCH = str(Path(__file__).with_name("mdns_watch.py"))


def test_a_non_members_record_is_ignored_and_a_goodbye_forgets_the_member(
    lan: Callable[[int], list[NetnsHost]],
) -> None:
    h_w, h_m, h_x = lan(3)
    (seed_w, _), (seed_m, id_m), (seed_x, id_x) = (seed_and_id() for _ in range(3))
    events: list[dict[str, Any]] = []
    with processes() as procs:
        # m is a member, x holds the fleet id (public) but is none; both advertise.
        m = start_node(h_m, "--seed", seed_m, "--fleet", "fleet-x", "--iface", "eth0",
                       "--until-eof", "--deadline", str(SCENARIO_TIMEOUT_S))
        procs.append(m)
        x = start_node(h_x, "--seed", seed_x, "--fleet", "fleet-x", "--iface", "eth0",
                       "--until-eof", "--deadline", str(SCENARIO_TIMEOUT_S))
        procs.append(x)
        w = subprocess.Popen(
            h_w.python(WATCH, "--seed", seed_w, "--fleet", "fleet-x", "--iface", "eth0",
                       "--member", id_m, "--until-lost", id_m, "--expect-not-member", "1",
                       "--deadline", str(SCENARIO_TIMEOUT_S)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        procs.append(w)
        read_until(w, events, lambda e: e["event"] == "peer")
        assert [e["id"] for e in events if e["event"] == "peer"] == [id_m]
        # m leaves the way a daemon stops: goodbye packets (TTL 0) on its way out.
        finish(m)
        out, err = w.communicate(timeout=SCENARIO_TIMEOUT_S)
        assert w.returncode == 0, err[-3000:]
        events += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        finish(x)
    done = events[-1]
    assert done["event"] == "done", events
    # Lost by its goodbye, within the run (its records would expire after minutes).
    assert done["lost"] == [id_m]
    assert id_x not in done["found"]  # the non-member's record never became a hint
    assert set(done["found"]) == {id_m}
    assert done["rejected"].get("not_member", 0) >= 1
