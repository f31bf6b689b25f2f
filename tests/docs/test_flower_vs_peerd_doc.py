"""docs/learners.md's "Flower and peerd side by side" table is what
benchmarks.flower_vs_peerd renders from the committed readings
(docs/results/flower-vs-peerd/accuracy-per-round.json): a number edited by hand, or readings
replaced without re-rendering, fails here; and the readings are the comparison issue 26
asks for (the same app, nodes and rounds on both sides, Flower's own simulation on Ray)."""

from __future__ import annotations

import json

from benchmarks._report import read_section
from benchmarks.flower_vs_peerd import LEARNERS, MARK, RESULT, render


def test_the_side_by_side_table_is_rendered_from_the_committed_readings() -> None:
    rendered = "\n".join(render(json.loads(RESULT.read_text())))
    assert read_section(MARK, LEARNERS) == rendered


def test_the_committed_readings_compare_like_with_like() -> None:
    r = json.loads(RESULT.read_text())
    n, rounds, f, p = r["nodes"], r["rounds"], r["flower"], r["peerd"]
    assert not r["dirty"]
    assert r["command"].startswith("python -m benchmarks.flower_vs_peerd")
    assert r["versions"]["flwr"] == "1.39.0"  # the flower extra's pin
    assert "flwr run" in f["command"]
    assert f"num-server-rounds={rounds}" in f["command"]
    assert f"num-supernodes={n}" in f["command"]
    assert len(f["central_accuracy"]) == rounds + 1
    assert len(f["client_eval_acc"]) == rounds
    settings = p["settings"]
    assert (settings["nodes"], settings["rounds"]) == (n, rounds)
    assert settings["rho"] == 0.0
    assert settings["alpha"] == "examples"
    assert settings["run_config"]["local-epochs"] == 2
    assert len(p["blend_accuracy"]) == n
    assert all(len(x) == rounds + 1 for x in p["blend_accuracy"])
    assert all(len(x) == rounds for x in p["trained_accuracy"] + p["client_eval_acc"])
    assert all(sum(x.values()) == 0 for x in p["learner_failed"])
    # Every pair gossiped after every round: each node blended the same models into x̄.
    for k in range(rounds + 1):
        assert len({node[k] for node in p["blend_accuracy"]}) == 1
    # Both sides learned: the app's digits are well past chance within the rounds.
    assert f["central_accuracy"][-1] > 0.5
    assert p["blend_accuracy"][0][-1] > 0.5
