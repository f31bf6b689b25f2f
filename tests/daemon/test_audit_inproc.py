"""`peerd audit` of a daemon that blended a peer: records written every round, read live
over the control socket (the operations `peerd run` serves) and, after the daemon stopped,
offline from its state directory. Two real ``Daemon`` objects in one process
(tests/daemon/inprocfleet.py); the real-process form is
tests/integration/test_audit_daemon.py (``long``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.control.server import Operations
from tests.daemon.helpers import running_server
from tests.daemon.inprocfleet import Fleet, fleet_configs

runner = CliRunner()


def _audit(*args: str) -> tuple[dict[str, Any], str]:
    done = runner.invoke(app, ["audit", "--json", *args])
    assert done.exit_code == 0, done.output
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc, done.stderr


def test_two_daemons_audit_live_and_offline(tmp_path: Path) -> None:
    fleet = Fleet(fleet_configs(tmp_path, 2, learning={"blend": "clipped:1.0",
                                                       "round_interval_s": 1.0}))
    me, other = fleet.daemons
    sock = tmp_path / "me.sock"
    with running_server(sock, Operations(me.status, me._clear_flag, me.participation.answer)):

        def blended_other() -> bool:
            doc, _ = _audit("--socket", str(sock))
            return any(m["origin"] == other.node.id for r in doc["records"]
                       for m in r["members"])

        for _ in range(5):
            fleet.cycle()
            if blended_other():
                break
        assert other.node.id in {i.meta.origin for i in me.node.cache}
        assert blended_other(), "node0 never recorded a round that blended node1"
        live, how = _audit("--socket", str(sock))
    assert live["source"] == "daemon"
    assert "running daemon" in how
    rounds = [r["round"] for r in live["records"]]
    assert rounds == list(range(1, len(rounds) + 1))  # one record per round, from round 1
    rec = next(r for r in live["records"] if len(r["members"]) == 2)
    own, peer = rec["members"]
    assert own["origin"] == me.node.id
    assert peer["origin"] == other.node.id
    assert rec["blend"] == "clipped:1.0"
    assert rec["mode"] == "weights"
    # Clipping's weights: the peer counts for at most its α, the own model takes the rest.
    assert 0.0 <= peer["weight"] <= peer["alpha"] + 1e-9
    assert abs(own["weight"] + peer["weight"] - 1.0) < 1e-6
    assert peer["staleness"] is not None
    assert peer["staleness"] >= 0.0
    assert peer["drift"] is not None
    assert peer["drift"] >= 0.0

    # The daemon stopped (its socket gone): the same records, from disk.
    offline, how = _audit("--state-dir", str(me.cfg.node.state_dir))
    assert offline["source"] == "state_dir"
    assert "not running" in how
    assert offline["skipped"] == 0
    assert offline["records"] == live["records"]
    since, _ = _audit("--state-dir", str(me.cfg.node.state_dir), "--since", str(rounds[-1]))
    assert next(r["round"] for r in since["records"]) == rounds[-1]
