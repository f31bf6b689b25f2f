"""The round guard (peerd.learn.viewguard): a round whose training explodes the loss on its
views is run again from the same start without the view that did it."""

from __future__ import annotations

import math

import numpy as np

from peerd.core.viewbound import loss_exploded
from peerd.learn.cordialround import PeerView
from peerd.learn.viewguard import guarded_round
from peerd.store.learnerfile import LearnerState


def test_a_loss_explodes_past_a_hundredfold_or_to_nan() -> None:
    assert not loss_exploded(1.0, 2.2)  # the largest healthy ratio seen: 2.2
    assert not loss_exploded(1.0, 100.0)
    assert loss_exploded(1.0, 101.0)
    assert loss_exploded(3.8, 2.5e19)
    assert loss_exploded(1.0, math.nan)
    assert loss_exploded(1.0, math.inf)
    assert not loss_exploded(math.nan, 1e30)  # nothing to compare with
    assert not loss_exploded(0.0, 1e-5)  # near zero: the floor


class Toy:
    """w += sum of the views' first values each round; loss = w²; agent 1 is poison."""

    def __init__(self) -> None:
        self.w = np.array([1.0])

    def snapshot(self, round_no: int) -> LearnerState:
        return LearnerState("toy", {}, round_no, {}, {"w": self.w})

    def load(self, saved: LearnerState) -> None:
        self.w = np.array(saved.tensors["w"], copy=True)

    def loss(self, views: list[PeerView]) -> float:
        return float(self.w[0] ** 2)

    def round(self, views: list[PeerView]) -> list[int]:
        self.w += sum(float(v.vectors[0, 0]) for v in views)  # in place: snapshot is a view
        return [v.agent for v in views]


def _view(agent: int, value: float) -> PeerView:
    return PeerView(agent, np.arange(1), np.full((1, 1), value, dtype=np.float32))


def test_a_sane_round_is_kept_as_run() -> None:
    toy = Toy()
    out, refused = guarded_round(toy, toy.round, [_view(1, 0.5), _view(2, -0.2)])
    assert (out, refused) == ([1, 2], [])
    assert math.isclose(float(toy.w[0]), 1.3, rel_tol=1e-6)


def test_the_view_that_exploded_the_round_is_left_out() -> None:
    toy = Toy()
    out, refused = guarded_round(toy, toy.round, [_view(1, 1e3), _view(2, 0.5)])
    assert (out, refused) == ([2], [1])
    assert float(toy.w[0]) == 1.5  # from the round's start, without agent 1


def test_with_no_single_culprit_the_round_runs_on_no_view() -> None:
    toy = Toy()
    out, refused = guarded_round(toy, toy.round, [_view(1, 1e3), _view(2, 1e3)])
    assert (out, refused) == ([], [1, 2])
    assert float(toy.w[0]) == 1.0
