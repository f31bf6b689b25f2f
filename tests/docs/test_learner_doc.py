"""docs/benchmarks.md's "Learner boundary" section is what benchmarks.bench_learner renders
from the committed readings (docs/reproduction/learner*.json): a number edited by hand, or
readings replaced without re-rendering, fails here; and the readings show what issue 26 asks
of the boundary (≤ 5 % of a K = 10 round, ≤ 2 model copies), for an 11M-parameter model."""

from __future__ import annotations

import json

from benchmarks._report import DOC
from benchmarks.bench_learner import MARK, readings_path, rendered


def test_the_learner_section_is_rendered_from_the_committed_readings() -> None:
    section = DOC.read_text().split(f"<!-- bench:{MARK} -->\n")[1].split(
        f"\n<!-- /bench:{MARK} -->")[0]
    assert section == "\n".join(rendered())


def test_the_committed_boundary_meets_the_issue() -> None:
    r = json.loads(readings_path("cpu").read_text())
    assert 10_000_000 <= r["params"] <= 12_000_000
    assert r["steps"] == 10
    assert r["boundary_fraction"] <= 0.05
    # The two buffers, kept; later calls add (about) nothing on top.
    assert r["kept_pss_copies"] + r["steady_growth_copies_max"] <= 2.05
    assert r["command"].startswith("python -m benchmarks.bench_learner")
