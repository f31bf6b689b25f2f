"""docs/transport.md's slow-link table (bench:slowlink, rendered by benchmarks/bench_slowlink.py
from docs/reproduction/slowlink/slowlink.json): the committed readings are one clean run of
every case, and they say what the prose around the table says."""

from __future__ import annotations

import json

from benchmarks import bench_slowlink as bs


def test_the_committed_readings_are_one_clean_run_of_every_case() -> None:
    data = json.loads(bs.READINGS.read_text())
    assert [(c["case"], c["encoding"], c["cut"]) for c in data["cases"]] == list(bs.CASES)
    assert data["provenance"]["dirty"] is False
    assert (data["rate_mbit"], data["loss_pct"]) == (20.0, 1.0)
    for c in data["cases"]:
        assert len(c["runs"]) == data["repeat"]
        for r in c["runs"]:
            assert r["bytes_in"] >= r["entry_bytes"] - r["bytes_not_resent"]


def test_every_cut_run_resumed_and_re_sent_less_than_the_entry() -> None:
    data = json.loads(bs.READINGS.read_text())
    [cut] = [c for c in data["cases"] if c["cut"]]
    for r in cut["runs"]:
        assert r["failed_sessions"] >= 1  # the cut ended a session: not TCP riding it out
        assert r["resumed"] == 1
        assert r["last_session_bytes"] < r["entry_bytes"]
        assert r["bytes_in"] < 1.1 * r["entry_bytes"]


def test_the_compact_encodings_cross_in_fewer_bytes() -> None:
    data = json.loads(bs.READINGS.read_text())
    frame = {c["case"]: c["runs"][0]["entry_bytes"] for c in data["cases"]}
    # float16 halves the payload; int8 (one scale per tensor) quarters it.
    assert 1.9 <= frame["float32"] / frame["float16"] <= 2.0
    assert 3.8 <= frame["float32"] / frame["int8"] <= 4.0
