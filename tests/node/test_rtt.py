"""Round-trip times: SRTT smoothing, the ping schedule and its bounds (peerd.node.rtt)."""

from __future__ import annotations

import pytest

from peerd.node.rtt import SRTT_GAIN, RttTable


def test_first_sample_then_rfc6298_smoothing() -> None:
    t = RttTable()
    t.record("a", 10.0)
    r = t.get("a")
    assert r is not None
    assert (r.smoothed_ms, r.last_ms) == (10.0, 10.0)
    t.record("a", 90.0)  # one slow sample moves it an eighth of the way
    assert r.smoothed_ms == pytest.approx(10.0 + SRTT_GAIN * 80.0) == pytest.approx(20.0)
    assert r.last_ms == 90.0
    t.failed("a")
    assert r.failures == 1
    assert r.smoothed_ms == pytest.approx(20.0)  # a failure keeps the value


def test_each_peer_at_most_once_per_interval() -> None:
    t = RttTable(interval_s=15.0, max_in_flight=10)
    assert t.due(["a", "b"], now=100.0) == ["a", "b"]
    assert t.due(["a", "b"], now=100.5) == []  # in flight
    t.record("a", 1.0)
    t.failed("b")
    assert t.due(["a", "b"], now=114.9) == []
    assert sorted(t.due(["a", "b"], now=115.0)) == ["a", "b"]


def test_in_flight_bound_longest_unpinged_first() -> None:
    t = RttTable(interval_s=15.0, max_in_flight=2)
    peers = ["a", "b", "c", "d", "e"]
    first = t.due(peers, now=0.0)
    assert len(first) == 2
    assert t.due(peers, now=0.1) == []  # both slots taken
    t.record(first[0], 1.0)
    second = t.due(peers, now=0.2)
    assert len(second) == 1
    assert second[0] not in first
    for p in first[1:] + second:
        t.record(p, 1.0)
    third = t.due(peers, now=0.3)
    # The two never pinged come before anyone pinged again.
    assert sorted(third) == sorted(set(peers) - set(first) - set(second))


def test_forgets_disconnected_peers() -> None:
    t = RttTable()
    t.record("a", 1.0)
    t.record("b", 2.0)
    t.keep_only(["b"])
    assert t.get("a") is None
    assert t.get("b") is not None
    t.due(["c"], now=0.0)  # c's ping is in flight: kept until it ends
    t.keep_only([])
    assert t.get("c") is not None
    t.failed("c")
    t.keep_only([])
    assert t.get("c") is None
