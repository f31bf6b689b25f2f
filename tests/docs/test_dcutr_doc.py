"""docs/transport.md's DCUtR table (bench:dcutr, rendered by benchmarks/dcutr_probe.py from
docs/reproduction/dcutr/dcutr-cases.json): the outcome and exceptions columns read the
reports as they mean, and the committed output is a clean run of every case."""

from __future__ import annotations

import json
from typing import Any

from benchmarks import dcutr_probe as dp


def _case(path: str | None, log: list[str] | None = None,
          errors: list[str] | None = None, initiate: object = None) -> dict[str, Any]:
    return {"case": "site-b-eim", "routers_drop": True,
            "listener": {"initiate_result": initiate, "initiate_s": 0.5,
                         "dcutr_log": log or [], "dial_errors": errors or []},
            "dialer": {"path": path, "dcutr_log": [], "dial_errors": []}}


def test_outcome_tells_a_punch_from_a_step_0_dial_and_a_relay() -> None:
    assert dp.outcome(_case("direct", initiate=True)) == "hole-punched"
    step0 = ["INFO Unilateral direct upgrade to 12D3 succeeded, skipping DCUtR"]
    assert dp.outcome(_case("direct", log=step0)) == "direct by step 0"
    assert dp.outcome(_case("lan", log=step0)) == "direct by step 0"
    assert dp.outcome(_case("relayed", initiate="timed out")) == "relayed"
    assert dp.outcome({"case": "public", "routers_drop": False, "listener": {},
                       "dialer": {"stderr": "boom"}}) == "failed"


def test_exceptions_count_errnos_and_name_a_failed_initiate() -> None:
    refused = ("TCP 10.79.1.2:4001 -> 203.0.113.3:4001: Failed to connect: [Errno 111] "
               "Connection refused (OSError(111, 'Connection refused'))")
    got = dp.exceptions(_case("relayed", errors=[refused, refused], initiate="timed out"))
    assert got == ["ECONNREFUSED ×2", "initiate_hole_punch: timed out"]
    assert dp.exceptions(_case("direct", initiate=True)) == []


def test_the_committed_cases_are_one_clean_run_of_every_case() -> None:
    data = json.loads(dp.READINGS.read_text())
    assert [(r["case"], r["routers_drop"]) for r in data["cases"]] == list(dp.CASES)
    prov = data["provenance"]
    assert prov["dirty"] is False
    assert "--case all" in prov["command_line"]
    # What the prose around the table says of the cases.
    outcomes = [dp.outcome(r) for r in data["cases"]]
    assert outcomes == ["hole-punched", "relayed", "relayed", "direct by step 0"]
