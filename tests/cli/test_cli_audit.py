"""`peerd audit`: live from the daemon, offline from the state directory's round log."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.cli.audit import SHOWN_METRICS
from peerd.cli.status import EXIT_NOT_RUNNING
from peerd.control.audit import Audit, AuditLearner, audit_to_json
from peerd.control.server import Operations
from peerd.core.entry import CacheItem, EntryMeta
from peerd.core.staleness import Clock
from peerd.core.updatenorm import Verdict
from peerd.daemon.participation import Participation
from peerd.learn.trainer import RoundOutput
from peerd.store.roundlog import ROUND_LOG_FILE
from peerd.store.statedir import StateDir
from tests.control.test_audit import sample_record
from tests.daemon.helpers import running_server, sample_status

runner = CliRunner(env={"COLUMNS": "200"})
OWN, PEER, BAD = "12D3KooWown", "12D3KooWpeer", "12D3KooWattacker"


def _state_with_rounds(state: Path, rounds: int = 3) -> None:
    """A state directory as a daemon leaves it: rounds 1..n, a refusal before round 2."""
    StateDir(state)  # made by the daemon before anything is written to it
    p = Participation(state, "clipped:1.0", clock=lambda: 1_800_000_000.0)
    cache = (CacheItem(EntryMeta(PEER, 4, 990.0, "s", 10, "d"), PEER, 990.0),
             CacheItem(EntryMeta(BAD, 6, 995.0, "s", 10, "d"), PEER, 995.0))
    for r in range(1, rounds + 1):
        if r == 2:
            p.refused(BAD, "bad_signature", 2)
        out = RoundOutput(params={}, alpha={OWN: 0.4, PEER: 0.3, BAD: 0.3}, examples=10,
                          train_loss=0.1, val_loss=0.1, val_accuracy=0.9, moved=1.0,
                          publish=True, weights={OWN: 0.69, PEER: 0.3, BAD: 0.01},
                          update_norms={PEER: 0.5, BAD: 30.0},
                          norm_verdicts={BAD: Verdict.CLIPPED})
        p.weights_round(round_no=r, out=out, own_id=OWN, cache=cache,
                        clock=Clock.time(1000.0), drift={PEER: 0.2, BAD: 31.5}, published=r)


def test_offline_json_reads_the_state_dir_and_says_so(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _state_with_rounds(state)
    result = runner.invoke(app, ["audit", "--json", "--state-dir", str(state)])
    assert result.exit_code == 0, result.output
    assert "not running" in result.stderr
    assert str(state) in result.stderr
    doc = json.loads(result.stdout)
    assert doc["source"] == "state_dir"
    assert doc["skipped"] == 0
    assert [r["round"] for r in doc["records"]] == [1, 2, 3]
    attacker = doc["records"][0]["members"][2]
    assert set(attacker) == {"origin", "version", "alpha", "weight", "staleness", "drift",
                             "update_norm", "verdict"}
    assert (attacker["origin"], attacker["alpha"], attacker["weight"], attacker["drift"],
            attacker["verdict"]) == (BAD, 0.3, 0.01, 31.5, "clipped")
    assert doc["records"][1]["refused"] == [
        {"peer": BAD, "reason": "bad_signature", "count": 2}]
    assert doc["records"][0]["refused"] == [] == doc["records"][2]["refused"]


def test_since_and_the_table(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _state_with_rounds(state)
    since = runner.invoke(app, ["audit", "--json", "--since", "2", "--state-dir", str(state)])
    assert [r["round"] for r in json.loads(since.stdout)["records"]] == [2, 3]
    human = runner.invoke(app, ["audit", "--since", "2", "--state-dir", str(state)])
    assert human.exit_code == 0, human.output
    assert "round 1 " not in human.stdout
    assert "round 2 " in human.stdout
    assert "blend clipped:1.0" in human.stdout
    assert f"refused: {BAD} bad_signature ×2" in human.stdout
    row = next(line for line in human.stdout.splitlines() if BAD in line and "0.300" in line)
    assert "31.5000" in row
    assert "clipped" in row
    assert "0.010" in row


def test_a_torn_tail_is_skipped_and_reported(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _state_with_rounds(state, 2)
    with (state / ROUND_LOG_FILE).open("ab") as fh:
        fh.write(b"0123abc torn")
    doc = json.loads(runner.invoke(app, ["audit", "--json", "--state-dir",
                                         str(state)]).stdout)
    assert [r["round"] for r in doc["records"]] == [1, 2]
    assert doc["skipped"] == 1
    human = runner.invoke(app, ["audit", "--state-dir", str(state)])
    assert "1 torn or corrupt record(s) skipped" in human.stdout


def test_live_from_the_daemon(tmp_path: Path) -> None:
    path = tmp_path / "peerd.sock"
    answer = audit_to_json(Audit(source="daemon", records=(sample_record(),), skipped=0))
    with running_server(path, Operations(sample_status, audit=lambda since: answer)):
        result = runner.invoke(app, ["audit", "--json", "--socket", str(path)])
        human = runner.invoke(app, ["audit", "--socket", str(path)])
    assert result.exit_code == 0, result.output
    assert "running daemon" in result.stderr
    assert json.loads(result.stdout) == answer
    assert "refused: 12D3KooWpeer bad_signature ×2" in human.stdout


def test_no_daemon_and_no_state_dir_exits_3(tmp_path: Path) -> None:
    result = runner.invoke(app, ["audit", "--socket", str(tmp_path / "none.sock")])
    assert result.exit_code == EXIT_NOT_RUNNING
    assert "--state-dir" in result.stderr


def test_withdrawn_entries_are_shown_with_their_reason(tmp_path: Path) -> None:
    # Issue 24 item 3: an entry taken out of the blend (its origin flagged) says why.
    state = tmp_path / "state"
    StateDir(state)
    p = Participation(state, "weighted", clock=lambda: 1_800_000_000.0)
    p.withdrawn(BAD, 6, "equivocation")
    out = RoundOutput(params={}, alpha={OWN: 1.0}, examples=10, train_loss=0.1, val_loss=0.1,
                      val_accuracy=0.9, moved=1.0, publish=False)
    p.weights_round(round_no=1, out=out, own_id=OWN, cache=(), clock=Clock.time(1000.0),
                    drift={}, published=None)
    shown = runner.invoke(app, ["audit", "--state-dir", str(state)])
    assert shown.exit_code == 0, shown.output
    assert f"withdrawn: {BAD}@6 (equivocation)" in shown.stdout
    doc = json.loads(runner.invoke(app, ["audit", "--json", "--state-dir", str(state)]).stdout)
    assert doc["records"][0]["withdrawn"] == [
        {"origin": BAD, "version": 6, "reason": "equivocation"}]


def test_a_learners_metrics_and_refusal_are_shown(tmp_path: Path) -> None:
    # Issue 26 item 8: each round's learner metrics in `peerd audit` (all of them in --json,
    # a few on one line in the human view), and why a refused round was refused.
    state = tmp_path / "state"
    StateDir(state)
    p = Participation(state, "weighted", clock=lambda: 1_800_000_000.0)
    out = RoundOutput(params={}, alpha={OWN: 1.0}, examples=10, train_loss=0.1, val_loss=0.1,
                      val_accuracy=0.9, moved=1.0, publish=False)
    fit = {f"m{i}": float(i) for i in range(SHOWN_METRICS + 2)}
    for r, lr in enumerate((AuditLearner(fit, {"accuracy": 0.8125}, None, None),
                            AuditLearner({}, {}, "raised", "ValueError: bad batch")), 1):
        p.weights_round(round_no=r, out=out, own_id=OWN, cache=(), clock=Clock.time(1000.0),
                        drift={}, published=None, learner=lr)
    doc = json.loads(runner.invoke(app, ["audit", "--json", "--state-dir", str(state)]).stdout)
    assert doc["records"][0]["learner"] == {"fit_metrics": fit,
                                            "eval_metrics": {"accuracy": 0.8125},
                                            "failure": None, "detail": None}
    assert doc["records"][1]["learner"]["failure"] == "raised"
    human = runner.invoke(app, ["audit", "--state-dir", str(state)]).stdout
    line = next(x for x in human.splitlines() if "learner fit:" in x)
    assert "m0 0.0000" in line
    assert f"m{SHOWN_METRICS - 1} " in line
    assert f"m{SHOWN_METRICS} " not in line
    assert "(+2 more)" in line
    assert "eval: accuracy 0.8125" in line
    assert "learner refused: raised (ValueError: bad batch)" in human
    assert human.count("learner fit:") == 1
