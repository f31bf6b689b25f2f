"""docs/learners.md's deployment table (Flower's SuperLink and SuperNodes against a peerd
mesh on the same namespace hosts) is what benchmarks.flower_vs_peerd_deploy renders from
the committed readings (docs/results/flower-vs-peerd/deployment.json); and the readings
hold the four runs issue 26 asks for, each fault where it was meant to be."""

from __future__ import annotations

import json

from benchmarks._report import read_section
from benchmarks.flower_vs_peerd import LEARNERS
from benchmarks.flower_vs_peerd_deploy import MARK, RESULT, render


def test_the_deployment_table_is_rendered_from_the_committed_readings() -> None:
    rendered = "\n".join(render(json.loads(RESULT.read_text())))
    assert read_section(MARK, LEARNERS) == rendered


def test_the_committed_deployment_runs_are_the_four_asked_for() -> None:
    r = json.loads(RESULT.read_text())
    runs = r["runs"]
    assert not r["dirty"]
    assert set(runs) == {"flower_plain", "flower_fault", "peerd_plain", "peerd_fault"}
    assert r["versions"]["flwr"] == "1.39.0"
    n = r["nodes"]
    assert all(len(x["bytes"]) == n for x in runs.values())
    # Flower: the plain run ran every round; the SuperLink died right after the fault round.
    assert runs["flower_plain"]["killed_superlink_at_s"] is None
    assert len(runs["flower_plain"]["global_accuracy"]) == r["rounds"]
    assert runs["flower_fault"]["killed_superlink_at_s"] is not None
    assert len(runs["flower_fault"]["global_accuracy"]) == r["fault_round"]
    # peerd: one node killed at the fault round, the others answered to the end.
    fault = runs["peerd_fault"]
    assert fault["killed"] == [n - 1, r["fault_round"]]
    assert runs["peerd_plain"]["killed"] is None
    last = [s[-1][0] for s in fault["samples"]]
    assert all(t >= fault["seconds"] - 5 for j, t in enumerate(last) if j != n - 1)
    assert last[n - 1] <= fault["killed_at_s"]
