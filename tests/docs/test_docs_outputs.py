"""The renderers of benchmarks.docs_outputs: how they write a figure, and that they read what
the output says (tests/docs/test_docs_tables.py diffs their renders against the docs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import docs_outputs as do


@pytest.mark.parametrize(("value", "text"), [
    (3.2241, "3.22"), (0.45123, "0.451"), (7.1312e-4, "7.13e-4"), (5.4835e-05, "5.48e-5"),
    (1.9312e19, "1.93e19"), (4.3004e136, "4.3e136"), (1.1312e4, "1.13e4"), (math.nan, "NaN"),
    (math.inf, "Inf"), (0.0, "0"),
])
def test_a_loss_is_written_with_three_significant_digits(value: float, text: str) -> None:
    assert do._sci(value) == text


def test_the_restart_column_says_what_the_learner_file_check_said() -> None:
    assert do._restart("restored the local learner (cordial mode) at round 10") == "restored"
    assert do._restart("corrupt state file $TMP/st0/blobs/learner (Λ_j^i reaches |3.26e+74| "
                       "> 10000: the learner had diverged; …)") == \
        "quarantined: Λ reaches 3.26e74"
    assert do._restart("corrupt state file x (NaN or Inf in lam: …)") == \
        "quarantined: NaN or Inf in Λ"
    assert do._restart("something new") == "something new"  # never hidden


def test_the_pairs_table_is_computed_from_the_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = tmp_path / "runs.json"
    provenance = json.loads(do.INTEGRATION_RUNS.read_text())["provenance"]
    runs.write_text(json.dumps({"runs": [
        {"run": 1, "wall_s": 100.4, "returncode": 0, "pairs": [[0.7, 0.5], [0.6, 0.6]]},
        {"run": 2, "wall_s": 50.0, "returncode": 1, "tail": "AssertionError"}],
        "four": {"wall_s": 9.0, "returncode": 0, "pytest": "python -m pytest", "rounds": 60,
                 "with_views": 0.9, "isolated": 0.6},
        "provenance": provenance}))
    monkeypatch.setattr(do, "INTEGRATION_RUNS", runs)
    lines = do.cordial_pairs().splitlines()
    # A run that printed nothing stays in the table, said so.
    assert lines[2:4] == ["| 1 | 0.700 / 0.500 | 0.600 / 0.600 | +10.0 points | 100 s |",
                          "| 2 | no result | no result | – | 50 s |"]
    assert "**0.900** with views against **0.600** isolated" in lines[5]
    assert lines[-1].startswith("Provenance: commit")


def test_the_committed_soak_runs_are_all_in_the_history_table() -> None:
    table = do.soak_history()
    for name, _ in do.SOAKS:
        assert f"[{name}](reliability/{name})" in table
    assert len(table.splitlines()) == 2 + len(do.SOAKS)
