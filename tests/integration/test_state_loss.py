"""Issue 12 item 1 on real `peerd run` processes: a node that lost its state directory (its
key kept) is accepted by its peers on its next publish, not after as many rounds as it had run.

Before the fix the restarted node published versions 1, 2, … while its peers held its old
version (here above 500) and refused every one of them as not newer: the node was ignored for
hundreds of rounds. Now it fetches its own newest entry back from the peer that holds it,
verifies its own signature on it and publishes past it.

Two daemons on loopback with static peers (no multicast, safe anywhere). Every wait is polled
with a timeout, never slept.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from peerd.store.statedir import Counters, StateDir
from tests.integration.mesh import (
    STARTUP_TIMEOUT_S,
    Node,
    audit,
    make_fleet,
    start,
    status,
    wait_for,
)

pytestmark = pytest.mark.integration

#: Versions the node had published before it lost its state: far more rounds than the test
#: waits for (one round a second), so only the fix can get its next entry accepted in time.
HISTORY = 500
#: From the restarted node's start to its entry at the peer: a gossip sweep (~3 s) to learn
#: its own version back, a round (1 s) to publish past it, a sweep to deliver it.
ACCEPTED_WITHIN_S = 60.0


def held_version(holder: Node, origin: str) -> int | None:
    s = holder.status()
    rows = [c["version"] for c in (s or {"cache": []})["cache"] if c["origin"] == origin]
    return rows[0] if rows else None


def lose_state(node: Node) -> None:
    """Everything the state directory holds but the identity key (peerd.store.statedir's
    layout): entries, cache index, adopted manifest, ledger, counters, audit log."""
    shutil.rmtree(node.dir / "blobs")
    shutil.rmtree(node.dir / "quarantine", ignore_errors=True)
    for path in [*node.dir.glob("counters.*"), *node.dir.glob("audit.log*")]:
        path.unlink()
    assert (node.dir / "node.key").exists()


# In-process in the default run (tests/daemon/test_state_loss_inproc.py); real daemons here.
@pytest.mark.long
def test_a_node_restarted_with_an_empty_state_dir_is_accepted_on_its_next_publish(
    tmp_path: Path, running: list[Node]
) -> None:
    a, b = make_fleet(tmp_path, 2, base_port=27800, learning={"local_steps": 3})
    # a has a long history: its counters as a daemon that ran HISTORY rounds leaves them.
    StateDir(a.dir).save_counters(Counters(round=HISTORY, version=HISTORY))
    start((a, b), running)
    wait_for(lambda: (held_version(b, a.id) or 0) > HISTORY, STARTUP_TIMEOUT_S,
             "b to hold one of a's entries", [a, b])
    a.stop()
    held = held_version(b, a.id)
    assert held is not None
    assert held > HISTORY

    lose_state(a)
    a.start()
    wait_for(lambda: a.status() is not None, STARTUP_TIMEOUT_S, "a to come back", [a, b])
    restarted = time.monotonic()
    starts = [e for e in audit(a) if e["event"] == "start"]
    assert [(e["round"], e["version"], e["cached"]) for e in starts] == [(0, 0, 0)]

    wait_for(lambda: (held_version(b, a.id) or 0) > held, ACCEPTED_WITHIN_S,
             f"b to accept a's next entry (newer than {held})", [a, b])
    print(f"\nstate loss: a's next entry accepted {time.monotonic() - restarted:.1f} s after "
          f"its restart (it had published {held} versions)")
    sa, sb = status(a), status(b)
    # a learnt its own version back from b (its entry fetched, verified, not cached) ...
    assert sa["dropped"].get("own_origin", 0) >= 1
    assert a.id not in {c["origin"] for c in sa["cache"]}
    assert sa["node"]["version"] > held
    # ... and nobody saw anything wrong: no refusal, no equivocation.
    for s in (sa, sb):
        assert s["rejected"] == {}
        assert s["flagged"] == []
