"""docs/robustness.md's results table is what benchmarks.robustness renders from the committed
per-run summaries (docs/robustness/*.json): a number edited by hand, or summaries replaced
without re-rendering, fails here; so does a number the prose quotes that the table lacks."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks import robustness as rb

DOC = Path(__file__).resolve().parents[2] / "docs" / "robustness.md"
SUMMARIES = DOC.parent / "robustness"


def _block(text: str) -> str:
    return text.split(rb.MARK_START + "\n")[1].split(rb.MARK_END)[0]


def test_the_table_is_rendered_from_the_committed_summaries() -> None:
    rendered = rb.table(SUMMARIES, rb.ATTACKS, rb.FRACTIONS, rb.RULES, rb.SEEDS,
                        rb.SIGN_FLIP_EXTRA)
    assert _block(DOC.read_text()) == rendered


def test_every_mean_and_std_the_prose_quotes_is_a_table_cell() -> None:
    text = DOC.read_text()
    block = _block(text)
    cells = set(re.findall(r"\d+\.\d ± \d+\.\d", block))
    prose = text.replace(block, "")
    quoted = re.findall(r"\d+\.\d ± \d+\.\d", prose)
    assert quoted, "the prose quotes no cell (the check would pass vacuously)"
    assert set(quoted) <= cells, f"quoted but not in the table: {set(quoted) - cells}"


def test_the_spread_is_the_sample_std() -> None:
    # One cell recomputed by hand from its three runs with ddof = 1.
    import json
    import statistics

    accs = [100 * json.loads((SUMMARIES / rb.name("none", 0.0, "weighted", s)).read_text())
            ["results"]["cached-dfl"]["final_accuracy_mean"] for s in rb.SEEDS]
    first = next(r for r in _block(DOC.read_text()).splitlines() if r.startswith("| none"))
    assert first.split("|")[3].strip() == (f"{statistics.fmean(accs):.1f} ± "
                                           f"{statistics.stdev(accs):.1f}")
