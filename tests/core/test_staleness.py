"""Staleness arithmetic and the τ_max cliff, with the lecture's worked numbers (§3.9.3)."""

from __future__ import annotations

import math

import pytest

from peerd.core.staleness import Clock, is_fresh
from tests.core.helpers import meta


def test_round_mode_seed_numbers_t7_tau3_is_4_and_kept_at_tau_max_5() -> None:
    clock = Clock.rounds(7)
    s = clock.staleness(meta("C2", 3))
    assert s == 4
    assert is_fresh(s, tau_max=5)


def test_round_mode_staleness_6_is_dropped_at_tau_max_5() -> None:
    s = Clock.rounds(7).staleness(meta("C3", 1))
    assert s == 6
    assert not is_fresh(s, tau_max=5)


def test_cliff_edge_is_inclusive() -> None:
    assert is_fresh(5, tau_max=5)
    assert not is_fresh(5.000001, tau_max=5)


def test_time_mode_five_hour_twin() -> None:
    hour = 3600.0
    now = 1_700_000_000.0
    clock = Clock.time(now)
    four_h = meta("C2", 9, created_at=now - 4 * hour)
    six_h = meta("C3", 9, created_at=now - 6 * hour)
    assert clock.staleness(four_h) == pytest.approx(4 * hour)
    assert is_fresh(clock.staleness(four_h), tau_max=5 * hour)
    assert not is_fresh(clock.staleness(six_h), tau_max=5 * hour)


def test_time_mode_ignores_version_and_round_mode_ignores_wall_clock() -> None:
    m = meta("C2", 3, created_at=100.0)
    assert Clock.time(150.0).staleness(m) == 50.0
    assert Clock.rounds(10).staleness(m) == 7.0


def test_nan_staleness_is_never_fresh_and_bad_tau_max_is_an_error() -> None:
    assert not is_fresh(math.nan, tau_max=5)
    with pytest.raises(ValueError, match="non-negative number, got -1"):
        is_fresh(1, tau_max=-1)
    with pytest.raises(ValueError, match="non-negative number, got nan"):
        is_fresh(1, tau_max=math.nan)
