"""docs/benchmarks.md's "Daemon: start-up" rows are what benchmarks._startup renders from the
committed readings (docs/reproduction/daemon-start.json): a number edited by hand, or
readings replaced without re-rendering, fails here."""

from __future__ import annotations

import json

from benchmarks._report import DOC
from benchmarks._startup import START_JSON, start_report


def test_the_start_up_section_is_rendered_from_the_committed_readings() -> None:
    readings = json.loads(START_JSON.read_text())
    section = DOC.read_text().split("<!-- bench:daemon-start -->")[1].split(
        "<!-- /bench:daemon-start -->")[0]
    rendered = "\n".join(start_report(readings))
    assert rendered in section
    assert len(readings["ready"]["now"]) == readings["runs"] >= 5  # medians of 5 or more
