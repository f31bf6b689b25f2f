"""docs/reproduction.md's generated tables against the outputs committed under docs/results/.

Every ``<!-- reproduce:table NAME -->`` block must be exactly what
:mod:`benchmarks.reproduce_tables` renders from the committed files, so a number edited by
hand, or an output changed without re-rendering, fails here. Two tables are also parsed and
checked against the JSON directly (not through the renderer), and the ``--quick`` path is run
end to end on a tiny configuration.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import reproduce, reproduce_tables
from benchmarks.reproduce import (
    Experiment,
    MissingOutputsError,
    Outputs,
    Run,
    marked_tables,
    render_report,
)

REPORT = reproduce.REPORT
RESULTS = reproduce.RESULTS


def _cells(block: str) -> list[list[str]]:
    """The body rows of the first markdown table in ``block``."""
    rows = [line for line in block.splitlines() if line.startswith("|")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]


def test_every_generated_table_matches_its_committed_outputs() -> None:
    text = REPORT.read_text()
    blocks = marked_tables(text)
    assert sorted(blocks) == sorted(reproduce_tables.TABLES), "a table is missing or extra"
    outputs = Outputs(RESULTS)
    for name, block in blocks.items():
        try:
            rendered = reproduce_tables.TABLES[name](outputs).rstrip("\n") + "\n"
        except MissingOutputsError as missing:  # not run: the report must say so, with no numbers
            rendered = missing.note()
        assert block == rendered, f"table {name!r} disagrees with docs/results/"


def test_smoke_table_numbers_are_the_summaries() -> None:
    rows = _cells(marked_tables(REPORT.read_text())["smoke"])
    assert [r[0] for r in rows] == ["0", "1", "2"]
    for seed, *accs in rows:
        summary = json.loads((RESULTS / "smoke" / f"s{seed}" / "summary.json").read_text())
        for alg, cell in zip(("cached-dfl", "dfl", "isolated"), accs, strict=True):
            assert float(cell) == round(summary["results"][alg]["final_accuracy_mean"], 3)


def test_table2_numbers_are_the_summaries() -> None:
    rows = _cells(marked_tables(REPORT.read_text())["table2"])
    assert len(rows) == len(reproduce_tables.TABLE2_ROUNDS) * len(reproduce_tables.TABLE2_TAUS)
    for rs, tau, peerd_tau, models, age, *_ in rows:
        summary = json.loads(
            (RESULTS / "table2" / f"rs{rs}-tau{tau}" / "summary.json").read_text())
        assert summary["config"]["tau_max"] == float(peerd_tau) == int(tau) - 1
        assert summary["config"]["stats_from"] > 1  # the warm-up is cut
        res = summary["results"]["cached-dfl"]
        assert float(models) == round(res["cache_avg_models"], 2)
        assert float(age) == round(res["cache_avg_age"], 2)


def test_table2_compares_every_cell_with_the_paper() -> None:
    rows = _cells(marked_tables(REPORT.read_text())["table2"])
    assert len(rows) == len(reproduce_tables.PAPER_TABLE2) == 21
    for rs, tau, *_, p_models, p_age, m_err, a_err in rows:
        paper = reproduce_tables.PAPER_TABLE2[(int(rs), int(tau))]
        assert (float(p_models), float(p_age)) == paper
        res = json.loads((RESULTS / "table2" / f"rs{rs}-tau{tau}" / "summary.json").read_text()
                         )["results"]["cached-dfl"]
        assert m_err == f"{(res['cache_avg_models'] - paper[0]) / paper[0] * 100:+.0f} %"
        assert a_err == f"{res['cache_avg_age'] - paper[1]:+.2f}"


def test_a_hand_edited_number_is_caught() -> None:
    block = marked_tables(REPORT.read_text())["smoke"]
    text = f"<!-- reproduce:table smoke -->\n{block}<!-- /reproduce -->\n"
    first = re.search(r"0\.\d{3}", block)
    assert first is not None
    edited = block.replace(first.group(0), "0.999" if first.group(0) != "0.999" else "0.998", 1)
    tampered = text.replace(block, edited)
    assert marked_tables(tampered)["smoke"] != reproduce_tables.smoke(Outputs(RESULTS))
    assert render_report(tampered, reproduce_tables.TABLES, Outputs(RESULTS)) == text


def test_quick_path_writes_outputs_and_tables(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = replace(reproduce_tables.SMOKE, agents=6, rounds=2, eval_every=2, local_steps=1,
                   eval_samples=50)
    quick = Experiment("smoke", "quick",
                       tuple(Run(f"s{s}", replace(tiny, seed=s)) for s in (0, 1, 2)))
    never = Experiment("never", "full", (Run("s0", replace(tiny, dataset="mnist")),))
    monkeypatch.setattr(reproduce_tables, "EXPERIMENTS", (quick, never))
    monkeypatch.setattr(reproduce_tables, "TABLES", {"smoke": reproduce_tables.smoke})
    report = tmp_path / "report.md"
    report.write_text("intro\n<!-- reproduce:table smoke -->\nold\n<!-- /reproduce -->\nend\n")
    results = tmp_path / "results"
    assert reproduce.main(["--quick", "--results", str(results), "--report", str(report)]) == 0
    assert not (results / "never").exists()  # --quick leaves the full tier alone
    for s in (0, 1, 2):
        folder = results / "smoke" / f"s{s}"
        assert sorted(p.name for p in folder.iterdir()) == ["metrics.csv", "run.json",
                                                            "summary.json"]
        meta = json.loads((folder / "run.json").read_text())
        assert meta["command"].startswith("peerd sim --agents 6 --rounds 2")
        assert (f"--seed {s}" in meta["command"]) == (s != 0)  # 0 is the default
        assert meta["config"]["seed"] == s
        assert meta["config"]["tau_max"] == tiny.tau_max
        prov = meta["provenance"]  # issue 28: commit, full command, machine, date, wall
        assert "--quick" in prov["command"]
        assert "--jobs" in prov["command"]
        assert len(prov["commit"]) == 40
        assert isinstance(prov["dirty"], bool)
        assert prov["machine"]["cores"] >= 1
        assert prov["wall_s"] == meta["wall_seconds"]
    text = report.read_text()
    assert text.startswith("intro\n<!-- reproduce:table smoke -->\n| seed |")
    assert text.endswith("<!-- /reproduce -->\nend\n")
    assert "old" not in text
    rows = _cells(marked_tables(text)["smoke"])
    summary = json.loads((results / "smoke" / "s1" / "summary.json").read_text())
    assert float(rows[1][1]) == round(summary["results"]["cached-dfl"]["final_accuracy_mean"], 3)


def test_missing_outputs_become_the_command_that_makes_them(tmp_path: Path) -> None:
    text = "a\n<!-- reproduce:table smoke -->\n| 0 | 0.9 |\n<!-- /reproduce -->\n"
    rendered = render_report(text, reproduce_tables.TABLES, Outputs(tmp_path))
    assert "0.9" not in rendered  # an old number never survives its outputs
    assert "`python -m benchmarks.reproduce --full --only smoke`" in rendered
    with pytest.raises(ValueError, match="unknown table"):
        render_report(text.replace("smoke", "nope"), reproduce_tables.TABLES, Outputs(tmp_path))
