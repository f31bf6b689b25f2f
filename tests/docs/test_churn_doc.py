"""docs/reliability.md's "Stranger churn" section is what benchmarks.bench_churn renders from
the committed readings (docs/reliability/churn.json): a number edited by hand, or readings
replaced without re-rendering, fails here; and the readings show what issue 24 asks of it."""

from __future__ import annotations

import json

from benchmarks.bench_churn import CHURN_JSON, MARK, RELIABILITY, render


def test_the_churn_section_is_rendered_from_the_committed_readings() -> None:
    readings = json.loads(CHURN_JSON.read_text())
    section = RELIABILITY.read_text().split(f"<!-- bench:{MARK} -->\n")[1].split(
        f"\n<!-- /bench:{MARK} -->")[0]
    assert section == "\n".join(render(readings))


def test_the_committed_churn_meets_the_issue() -> None:
    r = json.loads(CHURN_JSON.read_text())
    rows = r["readings"]
    assert r["strangers"] >= 5000
    assert rows[-1]["strangers"] == r["strangers"]
    assert all(x["alive"] for x in rows)
    assert rows[-1]["round"] > rows[0]["round"]
    assert r["member_session_ok"]
    assert r["member_session_s"] < 2.0
    assert rows[-1]["libp2p"]["handler_errors"] == 0
