"""The bound on a cordial peer's view (peerd.core.viewbound): its largest row norm against
10x the median of that agent's accepted views, the own view's scale and a floor of 1."""

from __future__ import annotations

import math

import numpy as np

from peerd.core.viewbound import ViewBound, view_scale


def test_a_views_scale_is_its_largest_row_norm() -> None:
    v = np.zeros((64, 3), dtype=np.float32)
    assert view_scale(v) == 0.0
    v[5] = [3.0, 4.0, 0.0]
    assert view_scale(v) == 5.0  # one row is enough: a mean would dilute it 64-fold
    v[6, 0] = np.nan
    assert view_scale(v) == math.inf
    assert view_scale(np.zeros((0, 3), dtype=np.float32)) == 0.0


def test_the_bound_follows_the_agent_the_own_view_and_the_floor() -> None:
    b = ViewBound()
    assert b.bound(1, own_scale=0.0) == 10.0  # nothing known: the floor
    assert b.bound(1, own_scale=3.0) == 30.0  # the own h_i's scale
    for s in (4.0, 5.0, 6.0):
        assert b.admit(1, s, own_scale=0.5)
    assert b.bound(1, own_scale=0.5) == 50.0  # the median of agent 1's accepted views
    assert b.bound(2, own_scale=0.5) == 10.0  # per agent
    assert b.bound(1, own_scale=math.inf) == 10.0  # a diverged own view lifts nothing


def test_refused_views_do_not_move_the_bound() -> None:
    b = ViewBound()
    assert b.admit(1, 2.0, own_scale=1.0)
    for _ in range(100):  # an attacker pushing ever larger views
        assert not b.admit(1, 1e3, own_scale=1.0)
        assert not b.admit(1, math.inf, own_scale=1.0)
        assert not b.admit(1, math.nan, own_scale=1.0)
    assert b.history[1] == [2.0]
    assert b.bound(1, own_scale=1.0) == 20.0


def test_the_history_is_a_window() -> None:
    b = ViewBound(window=4)
    for s in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
        assert b.admit(0, s, own_scale=0.0)
    assert b.history[0] == [3.0, 4.0, 5.0, 6.0]
