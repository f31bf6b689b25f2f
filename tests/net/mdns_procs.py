"""The child processes of the discovery tests in namespaces: fresh identities, mdns_node.py
started in a namespace, its JSON event lines read as they come or all at its end, and every
child killed when the test's block ends (also on failure).

Shared by tests/net/test_discovery_netns.py and tests/net/test_discovery_members_netns.py.
It must not start anything outside a namespace (mDNS never runs in the root namespace):
callers pass the namespaced host (tests/net/netns.py) each process runs in.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.protocol.identity import node_id_of
from tests.net.netns import NetnsHost

NODE = str(Path(__file__).with_name("mdns_node.py"))
#: Whole-scenario bound: start-up (~3 s of imports + mDNS probing) and discovery.
SCENARIO_TIMEOUT_S = 60
#: The children run from the repository root, so that they import this checkout.
REPO = Path(__file__).parents[2]


def seed_and_id() -> tuple[str, str]:
    """A fresh identity: its seed (hex, for --seed) and its node id."""
    seed = os.urandom(32)
    return seed.hex(), node_id_of(Ed25519PrivateKey.from_private_bytes(seed))


@contextmanager
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Children appended to the list are killed when the block ends, unless they ended."""
    procs: list[subprocess.Popen[str]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def start_node(h: NetnsHost, *args: str) -> subprocess.Popen[str]:
    """mdns_node.py in ``h``; its stdin stays open (closing it ends a --until-eof node)."""
    return subprocess.Popen(
        h.python(NODE, *args),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def finish(p: subprocess.Popen[str]) -> dict[str, Any]:
    """Wait for ``p`` to end: its "done" event, with all its events under ``events``."""
    # communicate() also closes stdin, which is what ends a --until-eof node.
    out, err = p.communicate(timeout=SCENARIO_TIMEOUT_S)
    assert p.returncode == 0, err[-3000:]
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    done: dict[str, Any] = events[-1]
    assert done["event"] == "done", out
    done["events"] = events
    return done


def read_until(p: subprocess.Popen[str], events: list[dict[str, Any]],
               want: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Read ``p``'s JSON lines into ``events`` up to the first that ``want``s (the node's own
    --deadline bounds the wait: it prints "done" and exits)."""
    assert p.stdout is not None
    for line in p.stdout:
        if not line.startswith("{"):
            continue
        event: dict[str, Any] = json.loads(line)
        events.append(event)
        if want(event):
            return event
        if event["event"] == "done":
            break
    err = p.stderr.read() if p.stderr else ""
    raise AssertionError(f"not seen; events: {events}; stderr: {err[-3000:]}")
