"""Issue 12 item 1: a node that lost its state directory (its key kept) is accepted by its
peers on its next publish, not after as many rounds as it had run.

Before the fix the restarted node published versions 1, 2, … while its peers held its old
version (here above 500) and refused every one of them as not newer: the node was ignored
for hundreds of rounds. Now it fetches its own newest entry back from the peer that holds
it, verifies its own signature on it and publishes past it.

Two real ``Daemon`` objects in one process (tests/daemon/inprocfleet.py): rounds, sessions
and restarts are the daemon's own, over its state directory on disk. The real-process form
is tests/integration/test_state_loss.py (``long``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from peerd.daemon.daemon import Daemon
from peerd.store.statedir import Counters, StateDir
from tests.daemon.inprocfleet import Fleet, fleet_configs

#: Versions the node had published before it lost its state: far more rounds than the test
#: runs, so only the fix can get its next entry accepted in time.
HISTORY = 500
#: From the restart to its entry at the peer: a sweep to learn its own version back, a
#: round to publish past it, a sweep to deliver it (one cycle is a round, then a sweep).
ACCEPTED_WITHIN_CYCLES = 3


def held_version(holder: Daemon, origin: str) -> int | None:
    rows = [i.meta.version for i in holder.node.cache if i.meta.origin == origin]
    return rows[0] if rows else None


def lose_state(state: Path) -> None:
    """Everything the state directory holds but the identity key (peerd.store.statedir's
    layout): entries, cache index, adopted manifest, ledger, counters, audit log."""
    shutil.rmtree(state / "blobs")
    shutil.rmtree(state / "quarantine", ignore_errors=True)
    for path in [*state.glob("counters.*"), *state.glob("audit.log*")]:
        path.unlink()
    assert (state / "node.key").exists()


def audit(state: Path) -> list[dict[str, Any]]:
    path = state / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_node_restarted_with_an_empty_state_dir_is_accepted_on_its_next_publish(
    tmp_path: Path
) -> None:
    cfgs = fleet_configs(tmp_path, 2, learning={"local_steps": 3, "round_interval_s": 1.0,
                                                "tau_max": 120.0})
    # a has a long history: its counters as a daemon that ran HISTORY rounds leaves them.
    StateDir(cfgs[0].node.state_dir).save_counters(Counters(round=HISTORY, version=HISTORY))
    fleet = Fleet(cfgs)
    a_id, a_dir = fleet[0].node.id, cfgs[0].node.state_dir
    fleet.cycle()
    held = held_version(fleet[1], a_id)
    assert held is not None
    assert held > HISTORY

    lose_state(a_dir)
    a = fleet.restart(0)
    b = fleet[1]
    starts = [e for e in audit(a_dir) if e["event"] == "start"]
    assert [(e["round"], e["version"], e["cached"]) for e in starts] == [(0, 0, 0)]

    cycles = 0
    while cycles < ACCEPTED_WITHIN_CYCLES and (held_version(b, a_id) or 0) <= held:
        cycles += 1
        fleet.cycle()
    assert (held_version(b, a_id) or 0) > held, (
        f"b holds a's version {held_version(b, a_id)} after {ACCEPTED_WITHIN_CYCLES} rounds, "
        f"not one newer than {held}")
    print(f"\nstate loss: a's next entry accepted {cycles} rounds after its restart (it had "
          f"published {held} versions)")
    sa, sb = a.status(), b.status()
    # a learnt its own version back from b (its entry fetched, verified, not cached) ...
    assert sa.dropped.get("own_origin", 0) >= 1
    assert a_id not in {c.origin for c in sa.cache}
    assert sa.node.version > held
    # ... and nobody saw anything wrong: no refusal, no equivocation.
    for s in (sa, sb):
        assert s.rejected == {}
        assert s.flagged == ()
