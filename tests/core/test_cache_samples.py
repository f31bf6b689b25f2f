"""Capacity in samples (knowledge entries): the freshest entries are kept while they fit."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.cache import merge
from peerd.core.entry import CacheItem
from peerd.core.reasons import Reason
from peerd.core.staleness import Clock
from tests.core.helpers import item


def sized(origin: str, version: int, samples: int, created_at: float) -> CacheItem:
    base = item(origin, version, created_at=created_at)
    meta = dataclasses.replace(base.meta, num_examples=samples, kind="knowledge")
    return dataclasses.replace(base, meta=meta)


CLOCK = Clock.time(100.0)


def test_freshest_first_until_the_budget_is_spent() -> None:
    received = [sized("a", 1, 60, 90.0), sized("b", 1, 30, 95.0), sized("c", 1, 20, 99.0)]
    result = merge([], received, clock=CLOCK, tau_max=50, capacity=10, sample_budget=100)
    assert [i.meta.origin for i in result.cache] == ["c", "b"]  # 20 + 30; + 60 > 100
    assert result.dropped == {Reason.EVICTED: 1}


def test_a_small_older_entry_does_not_jump_a_large_fresher_one() -> None:
    # "a" is fresher but too big for what is left: the merge stops; "b" (older, small) does
    # not take its place, so splitting knowledge into small entries buys nothing.
    received = [sized("c", 1, 50, 99.0), sized("a", 1, 80, 98.0), sized("b", 1, 10, 90.0)]
    result = merge([], received, clock=CLOCK, tau_max=50, capacity=10, sample_budget=100)
    assert [i.meta.origin for i in result.cache] == ["c"]
    assert result.dropped == {Reason.EVICTED: 2}


def test_no_budget_counts_entries_only() -> None:
    received = [sized(o, 1, 10**6, 99.0) for o in "abc"]
    assert len(merge([], received, clock=CLOCK, tau_max=50, capacity=2).cache) == 2


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=12),
       budget=st.integers(1, 200), capacity=st.integers(0, 12))
def test_the_kept_entries_fit_and_the_order_does_not_matter(
    sizes: list[int], budget: int, capacity: int
) -> None:
    received = [sized(f"o{i}", 1, n, 50.0 + i) for i, n in enumerate(sizes)]
    one = merge([], received, clock=CLOCK, tau_max=100, capacity=capacity, sample_budget=budget)
    two = merge([], received[::-1], clock=CLOCK, tau_max=100, capacity=capacity,
                sample_budget=budget)
    assert [i.meta.origin for i in one.cache] == [i.meta.origin for i in two.cache]
    assert sum(i.meta.num_examples for i in one.cache) <= budget
    assert len(one.cache) <= capacity
    # a prefix of the freshest: nothing fresher than a kept entry was left out
    kept = {i.meta.origin for i in one.cache}
    freshest = sorted(received, key=lambda i: -i.meta.created_at)[:len(kept)]
    assert kept == {i.meta.origin for i in freshest}
