"""The group-capped cache (capacity_per_group): the C most recent, as the lecture's step 5,
skipping an entry once its group holds q places; entries without a group are never skipped and
compete on recency alike; without groups, the old merge."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.cache import merge
from peerd.core.entry import CacheItem
from peerd.core.reasons import Reason
from peerd.core.staleness import Clock
from tests.core.helpers import item


def grouped(origin: str, version: int, group: str | None, **kw: object) -> CacheItem:
    base = item(origin, version, **kw)  # type: ignore[arg-type]
    return dataclasses.replace(base, meta=dataclasses.replace(base.meta, group=group))


def origins(cache: tuple[CacheItem, ...]) -> list[str]:
    return [i.meta.origin for i in cache]


CLOCK = Clock.rounds(10)


def test_a_crowd_of_one_group_does_not_push_out_the_other() -> None:
    # Five fresh neighbours of group "a" and one older "b": plain recency keeps only "a"s.
    received = [grouped(f"a{i}", 10 - i, "a") for i in range(5)] + [grouped("b0", 4, "b")]
    plain = merge([], received, clock=CLOCK, tau_max=10, capacity=3)
    assert origins(plain.cache) == ["a0", "a1", "a2"]
    result = merge([], received, clock=CLOCK, tau_max=10, capacity=3, capacity_per_group=2)
    assert origins(result.cache) == ["a0", "a1", "b0"]  # freshest first, as always
    assert result.dropped == {Reason.EVICTED: 3}
    assert result.accepted == result.cache


def test_the_quota_is_a_cap_and_entries_without_a_group_fill_the_rest() -> None:
    received = [grouped(f"a{i}", 10 - i, "a") for i in range(4)]
    received += [grouped("u0", 3, None), grouped("u1", 2, None), grouped("u2", 1, None)]
    result = merge([], received, clock=CLOCK, tau_max=10, capacity=4, capacity_per_group=1)
    # "a" holds one place although three fresher "a"s are left; the rest go by recency.
    assert origins(result.cache) == ["a0", "u0", "u1", "u2"]
    only_a = merge([], received[:4], clock=CLOCK, tau_max=10, capacity=4, capacity_per_group=1)
    assert origins(only_a.cache) == ["a0"]  # a cap, not a reservation: places stay empty


def test_with_more_groups_than_places_the_most_recent_win_under_the_cap() -> None:
    received = [grouped("a0", 10, "a"), grouped("a1", 9, "a"), grouped("a2", 8, "a"),
                grouped("b0", 7, "b"), grouped("c0", 6, "c"), grouped("d0", 5, "d")]
    result = merge([], received, clock=CLOCK, tau_max=10, capacity=4, capacity_per_group=2)
    # a's third is over the cap; its second is fresher than b0, so recency keeps it.
    assert origins(result.cache) == ["a0", "a1", "b0", "c0"]
    assert result.dropped == {Reason.EVICTED: 2}


def test_an_older_grouped_entry_never_evicts_a_fresher_ungrouped_one() -> None:
    # Issue 28: C = 2, q = 1; A@v10 (no group, age 0), C@v7 and B@v6 (one group each). The
    # old round-robin gave both places to the groups and dropped A, the freshest entry.
    received = [grouped("A", 10, None), grouped("C", 7, "g1"), grouped("B", 6, "g2")]
    result = merge([], received, clock=CLOCK, tau_max=10, capacity=2, capacity_per_group=1)
    assert origins(result.cache) == ["A", "C"]
    assert result.dropped == {Reason.EVICTED: 1}


def test_the_sample_budget_is_spent_freshest_first() -> None:
    def sized(origin: str, version: int, group: str, samples: int) -> CacheItem:
        base = grouped(origin, version, group)
        return dataclasses.replace(base, meta=dataclasses.replace(
            base.meta, num_examples=samples, kind="knowledge"))

    received = [sized("a0", 10, "a", 40), sized("a1", 9, "a", 40), sized("a2", 8, "a", 40),
                sized("b0", 7, "b", 10)]
    result = merge([], received, clock=CLOCK, tau_max=10, capacity=3, sample_budget=100,
                   capacity_per_group=2)
    # The cap leaves a0, a1, b0; b0 would fit the budget after them, so all three are kept.
    assert origins(result.cache) == ["a0", "a1", "b0"]
    tight = merge([], received, clock=CLOCK, tau_max=10, capacity=3, sample_budget=85,
                  capacity_per_group=2)
    assert origins(tight.cache) == ["a0", "a1"]  # b0 never jumps the queue to fit


def test_own_origin_and_age_still_come_first() -> None:
    received = [grouped("me", 9, "a"), grouped("a0", 8, "a"), grouped("old", 1, "b")]
    result = merge([], received, clock=CLOCK, tau_max=5, capacity=3, own_origin="me",
                   capacity_per_group=1)
    assert origins(result.cache) == ["a0"]  # our own model is no cache entry, "old" aged out
    assert result.own_max_version == 9
    assert result.dropped == {Reason.OWN_ORIGIN: 1, Reason.STALE: 1}


def test_a_negative_quota_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity_per_group"):
        merge([], [], clock=CLOCK, tau_max=5, capacity=3, capacity_per_group=-1)


# ---------------------------------------------------------------- properties (hypothesis)

ORIGINS = [f"N{i}" for i in range(8)]
GROUPS = ["g1", "g2", "g3", None]
received_items = st.lists(
    st.builds(
        lambda o, v, g, d, s, at: grouped(o, v, g, digest=d, sender=s, at=at),
        st.sampled_from(ORIGINS),
        st.integers(0, 20),
        st.sampled_from(GROUPS),
        st.sampled_from(["a" * 64, "b" * 64, None]),
        st.sampled_from(["P1", "P2", "P3"]),
        st.floats(0, 100, allow_nan=False),
    ),
    max_size=30,
)
params = dict(
    t=st.integers(0, 25),
    tau_max=st.integers(0, 10),
    capacity=st.integers(0, 6),
    quota=st.integers(0, 4),
)


def winners(received: list[CacheItem], clock: Clock, tau_max: int) -> list[CacheItem]:
    """Every fresh, latest-per-origin entry in merge order (the plain merge without a cap)."""
    return list(merge([], received, clock=clock, tau_max=tau_max, capacity=10**6).cache)


@settings(max_examples=300, deadline=None)
@given(received=received_items, seed=st.randoms(use_true_random=False), **params)
def test_the_grouped_merge_does_not_depend_on_arrival_order(
    received: list[CacheItem], seed: random.Random, t: int, tau_max: int, capacity: int,
    quota: int,
) -> None:
    shuffled = list(received)
    seed.shuffle(shuffled)
    kw = dict(clock=Clock.rounds(t), tau_max=tau_max, capacity=capacity,
              capacity_per_group=quota)
    a, b = merge([], received, **kw), merge([], shuffled, **kw)  # type: ignore[arg-type]
    assert a.cache == b.cache
    assert [(i.received_from, i.received_at) for i in a.cache] == [
        (i.received_from, i.received_at) for i in b.cache]
    assert a.dropped == b.dropped
    assert a.equivocations == b.equivocations


@settings(max_examples=300, deadline=None)
@given(received=received_items, **params)
def test_never_more_than_c_nor_more_than_q_per_group_and_otherwise_the_most_recent(
    received: list[CacheItem], t: int, tau_max: int, capacity: int, quota: int,
) -> None:
    clock = Clock.rounds(t)
    result = merge([], received, clock=clock, tau_max=tau_max, capacity=capacity,
                   capacity_per_group=quota)
    cache = list(result.cache)
    assert len(cache) <= capacity
    assert len({i.meta.origin for i in cache}) == len(cache)
    for group in GROUPS[:-1]:
        assert sum(i.meta.group == group for i in cache) <= quota
    everyone = winners(received, clock, tau_max)  # freshest first, ties as merge breaks them
    assert [i for i in everyone if i in cache] == cache  # freshest first, as the plain merge
    assert sum(result.dropped.values()) + len(result.accepted) == len(received)
    # Step 5 with a cap: every entry left out is either over its group's cap (q fresher
    # entries of its group are kept) or later than a full cache of C fresher entries.
    for rank, i in enumerate(everyone):
        if i in cache:
            continue
        fresher = everyone[:rank]
        capped = i.meta.group is not None and sum(
            j.meta.group == i.meta.group for j in fresher if j in cache) >= quota
        assert capped or (len(cache) == capacity and all(j in fresher for j in cache))


@settings(max_examples=300, deadline=None)
@given(received=received_items, held=received_items, **params)
def test_without_groups_the_quota_changes_nothing(
    received: list[CacheItem], held: list[CacheItem], t: int, tau_max: int, capacity: int,
    quota: int,
) -> None:
    def ungroup(items: list[CacheItem]) -> list[CacheItem]:
        return [dataclasses.replace(i, meta=dataclasses.replace(i.meta, group=None))
                for i in items]

    clock = Clock.rounds(t)
    start = list(merge([], ungroup(held), clock=clock, tau_max=tau_max,
                       capacity=capacity).cache)
    plain = merge(start, ungroup(received), clock=clock, tau_max=tau_max, capacity=capacity,
                  own_origin="N0")
    partitioned = merge(start, ungroup(received), clock=clock, tau_max=tau_max,
                        capacity=capacity, own_origin="N0", capacity_per_group=quota)
    assert partitioned == plain
