"""`peerd audit` against real daemons: records written every round, read live over the
control socket and, after the daemon stopped, offline from its state directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.mesh import Node, cached_origins, make_fleet, peerd, start, wait_for


def _audit(*args: str) -> tuple[dict[str, Any], str]:
    done = peerd("audit", "--json", *args)
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc, done.stderr


# In-process in the default run (tests/daemon/test_audit_inproc.py); real daemons here.
@pytest.mark.long
def test_two_daemons_audit_live_and_offline(tmp_path: Path, running: list[Node]) -> None:
    nodes = make_fleet(tmp_path, 2, base_port=27640, learning={"blend": "clipped:1.0"})
    start(nodes, running)
    me, other = nodes

    def blended_other() -> bool:
        if other.id not in cached_origins(me):
            return False
        doc, _ = _audit("--socket", str(me.socket))
        return any(m["origin"] == other.id for r in doc["records"] for m in r["members"])

    wait_for(blended_other, 120, "node0 to record a round that blended node1", nodes)
    live, how = _audit("--socket", str(me.socket))
    assert live["source"] == "daemon"
    assert "running daemon" in how
    rounds = [r["round"] for r in live["records"]]
    assert rounds == list(range(1, len(rounds) + 1))  # one record per round, from round 1
    rec = next(r for r in live["records"] if len(r["members"]) == 2)
    own, peer = rec["members"]
    assert own["origin"] == me.id
    assert peer["origin"] == other.id
    assert rec["blend"] == "clipped:1.0"
    assert rec["mode"] == "weights"
    # Clipping's weights: the peer counts for at most its α, the own model takes the rest.
    assert 0.0 <= peer["weight"] <= peer["alpha"] + 1e-9
    assert abs(own["weight"] + peer["weight"] - 1.0) < 1e-6
    assert peer["staleness"] is not None
    assert peer["staleness"] >= 0.0
    assert peer["drift"] is not None
    assert peer["drift"] >= 0.0

    me.stop()
    offline, how = _audit("--state-dir", str(me.dir))
    assert offline["source"] == "state_dir"
    assert "not running" in how
    assert offline["skipped"] == 0
    # What the daemon answered is what it left on disk (plus any rounds after the request).
    assert offline["records"][:len(live["records"])] == live["records"]
    since, _ = _audit("--state-dir", str(me.dir), "--since", str(rounds[-1]))
    assert next(r["round"] for r in since["records"]) == rounds[-1]
