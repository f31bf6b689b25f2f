"""Time buckets (cordial mode's sensors): a time's bucket, a bucket's id on the ring, a window's
ids sorted across the ring's wrap, and the slack a window and τ_max leave on the ring."""

from __future__ import annotations

import numpy as np
import pytest

from peerd.core.timebuckets import VIEW_IDS, bucket_id, bucket_of, ring_slack, window_ids


def test_a_time_falls_in_the_bucket_that_starts_at_or_before_it() -> None:
    assert [bucket_of(t, 10.0) for t in (0.0, 9.999, 10.0, 25.0, 30.0)] == [0, 0, 1, 2, 3]
    assert bucket_of(1_800_000_000.25, 0.5) == 3_600_000_000
    # Two nodes whose clocks read different moments of one bucket name the same sample.
    assert bucket_of(1_800_000_001.0, 10.0) == bucket_of(1_800_000_009.9, 10.0)
    for t, width in ((-1.0, 10.0), (float("nan"), 10.0), (5.0, 0.0), (5.0, -2.0)):
        with pytest.raises(ValueError, match="need t >= 0 and bucket_s > 0"):
            bucket_of(t, width)


def test_ids_wrap_around_the_ring() -> None:
    assert [bucket_id(b) for b in (0, 5, VIEW_IDS - 1, VIEW_IDS, VIEW_IDS + 7)] == [
        0, 5, VIEW_IDS - 1, 0, 7]
    assert bucket_id(23, view_ids=10) == 3


def test_a_window_across_the_wrap_publishes_sorted_ids() -> None:
    buckets = [3 * VIEW_IDS - 2, 3 * VIEW_IDS - 1, 3 * VIEW_IDS, 3 * VIEW_IDS + 1]
    ids, order = window_ids(buckets)
    assert ids.dtype == np.int32
    assert ids.tolist() == [0, 1, VIEW_IDS - 2, VIEW_IDS - 1]  # the newest get the smallest
    assert order.tolist() == [2, 3, 0, 1]
    assert (np.asarray(buckets)[order] % VIEW_IDS).tolist() == ids.tolist()
    assert bool(np.all(np.diff(ids) > 0))  # what a view's ids must be
    plain, same = window_ids([10, 11, 12])
    assert (plain.tolist(), same.tolist()) == ([10, 11, 12], [0, 1, 2])
    assert len(window_ids([])[0]) == 0


def test_a_window_as_wide_as_the_ring_is_refused() -> None:
    window_ids([0, 9], view_ids=10)  # spans 10 buckets: ids 0..9, all distinct
    with pytest.raises(ValueError, match="ids would repeat"):
        window_ids([0, 10], view_ids=10)


def test_ring_slack_counts_the_window_and_tau_max_lag() -> None:
    assert ring_slack(64, 600.0, 10.0) == VIEW_IDS - (64 + 60 + 1)
    assert ring_slack(64, 601.0, 10.0) == VIEW_IDS - (64 + 61 + 1)
    assert ring_slack(4, 600.0, 0.001) < 0  # 600,000 buckets of lag: old ids would alias
