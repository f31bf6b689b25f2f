"""An address change on the wire (issue 27 item 6): the deleted address's A record gets its
goodbye (TTL 0) before anything is announced, and is never announced again, neither before
its goodbye (the re-announcement of the old records that zeroconf's interface rescan made,
cache-flush, TTL 120) nor after it.

A node (tests/net/mdns_node.py) runs in one namespace; tests/net/mdns_capture.py in another
prints every A record that crosses the bridge. The node's address is then replaced
(tests.net.netns.replace_address). The node is alone on the LAN with a capture that never
queries, so after the deletion nothing asks for its records: every A record of the deleted
address that follows is one the node chose to send.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peerd.net.addrs import ADDRESS_POLL_S
from tests.net.mdns_procs import REPO, SCENARIO_TIMEOUT_S, processes, seed_and_id, start_node
from tests.net.netns import SUBNET, NetnsHost, replace_address

CAPTURE = str(Path(__file__).with_name("mdns_capture.py"))
#: After the goodbye, how long the capture goes on looking for a late announcement: past
#: zeroconf's announcement bursts (3 packets, 225 ms apart) and one more address poll.
AFTER_GOODBYE_S = ADDRESS_POLL_S + 2


def _lines(p: subprocess.Popen[str], until: Callable[[dict[str, Any]], bool],
           seen: list[dict[str, Any]]) -> dict[str, Any]:
    assert p.stdout is not None
    for line in p.stdout:
        event: dict[str, Any] = json.loads(line)
        seen.append(event)
        if until(event):
            return event
    err = p.stderr.read() if p.stderr else ""
    raise AssertionError(f"capture ended first; saw {seen}; stderr: {err[-2000:]}")


def test_no_a_record_of_a_deleted_address_but_its_goodbye(
    lan: Callable[[int], list[NetnsHost]],
) -> None:
    """Before the fix (commit edf8d92): 3 announcements of the deleted address (TTL 120)
    went out after its deletion, 0.47, 0.23 and 0.01 s before its goodbye. After: the goodbye,
    then three announcements of the new address (0.46 to 0.91 s later). With the goodbye
    sent only after the rescan (zeroconf having no socket on the new address before it), it
    left 0.003 s after the new address's third announcement, and a daemon's peer kept the
    deleted address (tests/integration/test_addresses.py failed, twice)."""
    h_a, h_b = lan(2)
    old, new = h_a.address, f"{SUBNET}.101"
    seed_a, id_a = seed_and_id()
    name = f"{id_a}.local."
    seen: list[dict[str, Any]] = []
    with processes() as procs:
        capture = subprocess.Popen(
            h_b.python(CAPTURE, "--address", h_b.address, "--seconds", str(SCENARIO_TIMEOUT_S)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=REPO)
        procs.append(capture)
        _lines(capture, lambda e: e["event"] == "ready", seen)
        a = start_node(h_a, "--seed", seed_a, "--fleet", "fleet-x", "--until-eof",
                       "--deadline", str(SCENARIO_TIMEOUT_S))
        procs.append(a)

        def names(e: dict[str, Any], address: str, *, goodbye: bool) -> bool:
            return e["event"] == "a" and any(
                n == name and addr == address and (ttl == 0) == goodbye
                for n, addr, ttl in e["records"])

        _lines(capture, lambda e: names(e, old, goodbye=False), seen)  # announced at start
        time.sleep(1.5)  # its start-up bursts are over
        replace_address(h_a, new)
        deleted = time.monotonic()
        goodbye = _lines(capture, lambda e: names(e, old, goodbye=True), seen)
        time.sleep(AFTER_GOODBYE_S)
        out, _ = capture.communicate(timeout=SCENARIO_TIMEOUT_S)
        seen += [json.loads(line) for line in out.splitlines()]
    after = [e for e in seen if e["event"] == "a" and e["t"] > deleted]
    announced = [(round(e["t"] - goodbye["t"], 3), r) for e in after for r in e["records"]
                 if r[0] == name and r[1] == old and r[2] > 0]
    assert not announced, f"the deleted address announced (s from its goodbye): {announced}"
    # And the node did move, its goodbye first: the new address is announced after it.
    moved = [e["t"] for e in after for r in e["records"]
             if r[0] == name and r[1] == new and r[2] > 0]
    assert moved, after
    assert goodbye["t"] <= min(moved), (goodbye, after)
