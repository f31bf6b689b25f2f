"""docs/transport.md's slow-link tables (bench:slowlink and bench:slowlink-delay, rendered by
benchmarks/bench_slowlink.py from docs/reproduction/slowlink/slowlink.json and
slowlink-delay.json): the committed readings are one clean run of every case, on the link
each table names, and they say what the prose around the tables says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_slowlink as bs

#: Each readings file and the delay each way its table says it had.
READINGS = pytest.mark.parametrize(("path", "delay_ms"),
                                   [(bs.READINGS, 0.0), (bs.READINGS_DELAY, 40.0)])


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


@READINGS
def test_the_committed_readings_are_one_clean_run_of_every_case(path: Path,
                                                               delay_ms: float) -> None:
    data = _load(path)
    assert data.get("delay_ms", 0.0) == delay_ms
    assert [(c["case"], c["encoding"], c["cut"]) for c in data["cases"]] == list(bs.CASES)
    assert data["provenance"]["dirty"] is False
    assert (data["rate_mbit"], data["loss_pct"]) == (20.0, 1.0)
    for c in data["cases"]:
        assert len(c["runs"]) == data["repeat"]
        for r in c["runs"]:
            assert r["bytes_in"] >= r["entry_bytes"] - r["bytes_not_resent"]


@READINGS
def test_every_cut_run_resumed_and_re_sent_less_than_the_entry(path: Path,
                                                              delay_ms: float) -> None:
    data = _load(path)
    [cut] = [c for c in data["cases"] if c["cut"]]
    for r in cut["runs"]:
        assert r["failed_sessions"] >= 1  # the cut ended a session: not TCP riding it out
        assert r["resumed"] == 1
        assert r["last_session_bytes"] < r["entry_bytes"]
        assert r["bytes_in"] < 1.1 * r["entry_bytes"]


@READINGS
def test_the_compact_encodings_cross_in_fewer_bytes(path: Path, delay_ms: float) -> None:
    data = _load(path)
    frame = {c["case"]: c["runs"][0]["entry_bytes"] for c in data["cases"]}
    # float16 halves the payload; int8 (one scale per tensor) quarters it.
    assert 1.9 <= frame["float32"] / frame["float16"] <= 2.0
    assert 3.8 <= frame["float32"] / frame["int8"] <= 4.0
