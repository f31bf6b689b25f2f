"""The five-step cache merge (§3.9.4): age, per-origin latest, recency, capacity, relay."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.cache import merge
from peerd.core.entry import CacheItem
from peerd.core.reasons import Reason
from peerd.core.staleness import Clock
from tests.core.helpers import item


def origins_versions(cache: tuple[CacheItem, ...]) -> list[tuple[str, int]]:
    return [(i.meta.origin, i.meta.version) for i in cache]


def test_relay_c1_holding_c3_at_1_merges_c2_cache_with_c3_at_2() -> None:
    # The lecture's clocks: C3@1 o'clock held by C1; C2 got C3@2 from C3 directly.
    held = [item("C3", 1, sender="C3", created_at=3600.0)]
    c2_cache = [item("C3", 2, sender="C2", created_at=7200.0)]
    result = merge(held, c2_cache, clock=Clock.time(8000.0), tau_max=5 * 3600, capacity=10)
    assert origins_versions(result.cache) == [("C3", 2)]
    assert result.cache[0].received_from == "C2"  # provenance: relayed by C2, origin C3
    assert result.accepted == result.cache
    assert result.dropped == {}  # a superseded held entry is replaced, not "dropped"


def test_lecture_round_walkthrough_drops_c3_at_1_aged_6() -> None:
    # §3.11.2: at t=7 a C3-at-1 entry (age 6 > 5) is dropped; C2-at-6 and C4-at-5 survive.
    held = [item("C3", 1), item("C2", 6)]
    received = [item("C4", 5)]
    result = merge(held, received, clock=Clock.rounds(7), tau_max=5, capacity=10)
    assert origins_versions(result.cache) == [("C2", 6), ("C4", 5)]
    assert [i.meta.origin for i in result.expired] == ["C3"]
    assert result.dropped == {Reason.STALE: 1}


def test_over_age_received_entries_are_dropped_too() -> None:
    result = merge([], [item("C5", 0)], clock=Clock.rounds(10), tau_max=5, capacity=10)
    assert result.cache == ()
    assert result.dropped == {Reason.STALE: 1}


def test_older_or_equal_versions_are_not_newer_and_counted() -> None:
    held = [item("C2", 4)]
    received = [item("C2", 3), item("C2", 4)]
    result = merge(held, received, clock=Clock.rounds(5), tau_max=5, capacity=10)
    assert result.cache == tuple(held)
    assert result.dropped == {Reason.NOT_NEWER: 2}
    assert result.accepted == ()


def test_equivocation_same_version_different_payload_is_reported_and_held_kept() -> None:
    held = [item("C2", 4, digest="1" * 64)]
    forged = item("C2", 4, digest="0" * 64)
    result = merge(held, [forged], clock=Clock.rounds(5), tau_max=5, capacity=10)
    assert result.cache[0] is held[0]
    assert result.dropped == {Reason.EQUIVOCATION: 1}
    assert len(result.equivocations) == 1
    e = result.equivocations[0]
    assert (e.origin, e.version, e.digests) == ("C2", 4, ("0" * 64, "1" * 64))


def test_capacity_keeps_the_freshest_c_and_counts_evictions() -> None:
    received = [item(f"C{i}", i) for i in range(1, 7)]
    result = merge([], received, clock=Clock.rounds(6), tau_max=10, capacity=3)
    assert origins_versions(result.cache) == [("C6", 6), ("C5", 5), ("C4", 4)]
    assert result.dropped == {Reason.EVICTED: 3}


def test_own_entries_relayed_back_are_dropped_but_their_version_reported() -> None:
    received = [item("me", 7), item("me", 9), item("C2", 8)]
    result = merge([], received, clock=Clock.rounds(9), tau_max=5, capacity=10, own_origin="me")
    assert origins_versions(result.cache) == [("C2", 8)]
    assert result.own_max_version == 9
    assert result.dropped == {Reason.OWN_ORIGIN: 2}


def test_capacity_zero_keeps_nothing() -> None:
    result = merge([], [item("C2", 1)], clock=Clock.rounds(1), tau_max=5, capacity=0)
    assert result.cache == ()


# ---------------------------------------------------------------- properties (hypothesis)

ORIGINS = [f"N{i}" for i in range(6)]
received_items = st.lists(
    st.builds(
        lambda o, v, d, s, at: item(o, v, digest=d, sender=s, at=at),
        st.sampled_from(ORIGINS),
        st.integers(0, 20),
        st.sampled_from(["a" * 64, "b" * 64, None]),
        st.sampled_from(["P1", "P2", "P3"]),
        st.floats(0, 100, allow_nan=False),
    ),
    max_size=30,
)
params = dict(
    t=st.integers(0, 25),
    tau_max=st.integers(0, 10),
    capacity=st.integers(0, 5),
)


@settings(max_examples=300, deadline=None)
@given(received=received_items, **params)
def test_merge_never_exceeds_capacity_nor_keeps_over_age(
    received: list[CacheItem], t: int, tau_max: int, capacity: int
) -> None:
    result = merge([], received, clock=Clock.rounds(t), tau_max=tau_max, capacity=capacity)
    assert len(result.cache) <= capacity
    assert all(t - i.meta.version <= tau_max for i in result.cache)
    assert len({i.meta.origin for i in result.cache}) == len(result.cache)


@settings(max_examples=300, deadline=None)
@given(received=received_items, **params)
def test_merge_keeps_the_max_fresh_version_per_origin(
    received: list[CacheItem], t: int, tau_max: int, capacity: int
) -> None:
    result = merge([], received, clock=Clock.rounds(t), tau_max=tau_max, capacity=capacity)
    for kept in result.cache:
        fresh = [
            i.meta.version
            for i in received
            if i.meta.origin == kept.meta.origin and t - i.meta.version <= tau_max
        ]
        assert kept.meta.version == max(fresh)
    # every dropped received item is accounted for exactly once
    assert sum(result.dropped.values()) + len(result.accepted) == len(received)


@settings(max_examples=300, deadline=None)
@given(received=received_items, seed=st.randoms(use_true_random=False), **params)
def test_merge_result_does_not_depend_on_arrival_order(
    received: list[CacheItem], seed: object, t: int, tau_max: int, capacity: int
) -> None:
    import random

    assert isinstance(seed, random.Random)
    shuffled = list(received)
    seed.shuffle(shuffled)
    a = merge([], received, clock=Clock.rounds(t), tau_max=tau_max, capacity=capacity)
    b = merge([], shuffled, clock=Clock.rounds(t), tau_max=tau_max, capacity=capacity)
    assert a.cache == b.cache
    assert [(i.received_from, i.received_at) for i in a.cache] == [
        (i.received_from, i.received_at) for i in b.cache
    ]
    assert a.dropped == b.dropped
    assert a.equivocations == b.equivocations


@settings(max_examples=200, deadline=None)
@given(first=received_items, second=received_items, **params)
def test_merging_twice_keeps_cache_consistent(
    first: list[CacheItem], second: list[CacheItem], t: int, tau_max: int, capacity: int
) -> None:
    clock = Clock.rounds(t)
    a = merge([], first, clock=clock, tau_max=tau_max, capacity=capacity)
    b = merge(list(a.cache), second, clock=clock, tau_max=tau_max, capacity=capacity)
    assert len(b.cache) <= capacity
    held_origins = {i.meta.origin: i.meta.version for i in a.cache}
    for kept in b.cache:
        if kept.meta.origin in held_origins:
            assert kept.meta.version >= held_origins[kept.meta.origin]


def test_equally_fresh_ties_are_broken_per_observer_not_by_lowest_origin_id() -> None:
    # Round mode: all entries of one round are equally fresh. Ranking ties by origin id
    # would make every node of the fleet keep the same lowest-id peers.
    received = [item(f"N{i:02d}", 5) for i in range(20)]
    kept = {
        observer: {i.meta.origin for i in merge([], received, clock=Clock.rounds(5), tau_max=5,
                                                 capacity=3, own_origin=observer).cache}
        for observer in (f"obs{j}" for j in range(8))
    }
    assert all(len(k) == 3 for k in kept.values())
    assert len({frozenset(k) for k in kept.values()}) > 1  # observers differ in their picks
    again = merge([], list(reversed(received)), clock=Clock.rounds(5), tau_max=5, capacity=3,
                  own_origin="obs0").cache
    assert {i.meta.origin for i in again} == kept["obs0"]  # and each observer is stable
