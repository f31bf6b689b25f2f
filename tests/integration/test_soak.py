"""The soak and fault suite, short form (issue 12): 80–100 s of real daemons in
namespaces with every fault kind at least once, at smaller sizes (50 strangers, 100 fake
mDNS instances). The 30-minute run is `python -m benchmarks.soak` (docs/reliability.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peerd.mesh.netns import unavailable
from tests.integration.soak import KINDS, SoakConfig, run_soak, verdict

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHORT = SoakConfig(minutes=0.0, daemons=3, round_interval_s=3.0, flood=50, flood_hold_s=10.0,
                   wave=100, partition_s=8.0, clock_hold_s=8.0, churn_between=False,
                   converge_timeout_s=90.0)


def test_short_soak_every_fault_kind_and_every_invariant(tmp_path: Path) -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    figures = run_soak(SHORT, tmp_path)
    (tmp_path / "soak.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps({k: figures[k] for k in ("duration_s", "convergence", "entries",
                                              "restart_s")}, indent=1))
    assert set(figures["faults_by_kind"]) >= {*KINDS, "churn", "stranger_flood_held"}
    assert verdict(figures) == []
    assert figures["corrupt_states"] == 0
    assert all(st["ok"] for st in figures["states"].values()), figures["states"]
    # The member's garbage was refused by reason, never accepted as an entry of it.
    rejected = figures["entries"]["rejected"]
    assert {"payload_mismatch", "shape_mismatch", "malformed", "too_large"} <= set(rejected)
    assert figures["entries"]["accepted"] > 0
    # The outsiders were refused at the door (strangers' connections) and never listed.
    assert rejected.get("not_member", 0) > 0
    assert figures["max_peer_rows"] <= SHORT.daemons
