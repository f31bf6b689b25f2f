"""The per-peer byte budget (a token bucket), on an explicit clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerd.net.transport_config import ByteBudget, TransportConfig


def test_starts_full_then_refuses_once_the_burst_is_spent() -> None:
    b = ByteBudget(rate=100.0, burst=1000.0)
    assert b.available(0.0)
    b.charge(999, 0.0)
    assert b.available(0.0)  # 1 byte left
    b.charge(500, 0.0)  # one chunk may overdraw
    assert not b.available(0.0)
    assert b.wait_s(0.0) == pytest.approx(500 / 100)


def test_refills_at_rate_and_never_beyond_the_burst() -> None:
    b = ByteBudget(rate=100.0, burst=1000.0)
    b.charge(1500, 0.0)  # balance -500
    assert not b.available(4.0)  # -100
    assert b.available(6.0)  # +100
    assert b.available(1e6)
    assert b.balance == 1000.0


def test_a_clock_that_steps_back_does_not_mint_bytes() -> None:
    b = ByteBudget(rate=100.0, burst=1000.0)
    b.charge(1000, 10.0)
    assert not b.available(5.0)
    assert not b.available(10.0)


def test_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError, match="positive rate and burst"):
        ByteBudget(rate=0.0, burst=10.0)
    with pytest.raises(ValueError, match="positive rate and burst"):
        ByteBudget(rate=10.0, burst=-1.0)


def test_config_gives_each_peer_its_own_pair_of_budgets() -> None:
    assert TransportConfig().new_peer_stats().budget_in is None  # unlimited by default
    cfg = TransportConfig(peer_bytes_per_s=10, peer_burst_bytes=50)
    one, two = cfg.new_peer_stats(), cfg.new_peer_stats()
    assert one.budget_in is not None
    assert one.budget_out is not None
    assert one.budget_in is not two.budget_in
    assert one.budget_in is not one.budget_out
    assert one.budget_in.burst == 50


@given(st.lists(st.tuples(st.floats(0, 10), st.integers(0, 5000)), max_size=50))
def test_bytes_accepted_never_exceed_burst_plus_rate_times_time_plus_one_chunk(
    steps: list[tuple[float, int]]
) -> None:
    b = ByteBudget(rate=100.0, burst=1000.0)
    now, accepted, largest = 0.0, 0, 0
    for dt, n in steps:
        now += dt
        if b.available(now):
            b.charge(n, now)
            accepted += n
            largest = max(largest, n)
    assert accepted <= 1000 + 100 * now + largest
