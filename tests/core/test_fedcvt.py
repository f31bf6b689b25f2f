"""FedCVT (seed ``fedbss-fedcvt-lecture.txt`` §16.6): the attention fill against a hand-computed
example, its stability and shape errors, and the pseudo-label gate on the lecture's three
accept/reject cartoons."""

from __future__ import annotations

import math

import pytest
import torch

from peerd.core.fedcvt import attention_fill, attention_weights, cross_view_loss, pseudo_label_gate

CAT, DOG, BIRD = 0, 1, 2


def _vote(cls: int, p: float) -> list[float]:
    """A three-class probability row with ``p`` on ``cls`` and the rest split evenly."""
    row = [(1.0 - p) / 2] * 3
    row[cls] = p
    return row


def _gate(a: tuple[int, float], b: tuple[int, float], ab: tuple[int, float],
          threshold: float = 0.5) -> tuple[bool, int]:
    g = pseudo_label_gate(torch.tensor([_vote(*a)]), torch.tensor([_vote(*b)]),
                          torch.tensor([_vote(*ab)]), threshold=threshold)
    return bool(g.accepted[0]), int(g.labels[0])


# ----------------------------------------------------------------------------- attention


def test_attention_matches_a_hand_computed_example() -> None:
    # d_k = 4, so the scale is 1/√4 = 1/2. Scores: q·k1/2 = (2 ln 3)/2 = ln 3, q·k2/2 = 0;
    # softmax([ln 3, 0]) = [3/4, 1/4]; filled = 3/4·[4, 0] + 1/4·[0, 8] = [3, 2].
    q = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    k = torch.tensor([[2 * math.log(3), 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]],
                     dtype=torch.float64)
    v = torch.tensor([[4.0, 0.0], [0.0, 8.0]], dtype=torch.float64)
    assert torch.allclose(attention_weights(q, k), torch.tensor([[0.75, 0.25]],
                                                                dtype=torch.float64))
    assert torch.allclose(attention_fill(q, k, v), torch.tensor([[3.0, 2.0]],
                                                                dtype=torch.float64))
    # Sharpening with T = 1/2 is softmax(2·[ln 3, 0]) = [9/10, 1/10] → [3.6, 0.8].
    assert torch.allclose(attention_fill(q, k, v, sharpen=0.5),
                          torch.tensor([[3.6, 0.8]], dtype=torch.float64))


def test_weights_are_a_convex_combination() -> None:
    gen = torch.Generator().manual_seed(0)
    w = attention_weights(torch.randn(5, 8, generator=gen), torch.randn(7, 8, generator=gen))
    assert w.shape == (5, 7)
    assert bool((w >= 0).all())
    assert torch.allclose(w.sum(dim=1), torch.ones(5))


def test_huge_dot_products_do_not_overflow() -> None:
    # Scores of 1e6 would make a naive exp() inf and the weights NaN.
    q = torch.tensor([[1e3, 0.0]])
    k = torch.tensor([[1e3, 0.0], [-1e3, 0.0], [999.0, 0.0]])
    v = torch.tensor([[1.0], [2.0], [3.0]])
    out = attention_fill(q, k, v)
    assert bool(torch.isfinite(out).all())
    assert torch.allclose(out, torch.tensor([[1.0]]))  # row 1 wins by a margin of ~700 nats


@pytest.mark.parametrize(
    ("q", "k", "v", "match"),
    [
        ((2, 3), (4, 5), (4, 2), "differ in d_k"),
        ((3,), (4, 3), (4, 2), r"query \[M, d_k\]"),
        ((2, 3), (0, 3), (0, 2), "at least one aligned row"),
        ((2, 3), (4, 3), (5, 2), "values must be"),
    ],
)
def test_shape_errors_are_clear(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...],
                                match: str) -> None:
    with pytest.raises(ValueError, match=match):
        attention_fill(torch.zeros(q), torch.zeros(k), torch.zeros(v))


def test_bad_sharpen_temperature_is_refused() -> None:
    with pytest.raises(ValueError, match="sharpen"):
        attention_weights(torch.zeros(1, 2), torch.zeros(1, 2), sharpen=0.0)


# ----------------------------------------------------------------------------- the gate


def test_lecture_accept_cat_80_70_90() -> None:
    assert _gate((CAT, 0.8), (CAT, 0.7), (CAT, 0.9)) == (True, CAT)


def test_lecture_reject_when_one_says_dog() -> None:
    accepted, _ = _gate((CAT, 0.8), (CAT, 0.7), (DOG, 0.9))
    assert not accepted


def test_lecture_reject_all_cat_at_40() -> None:
    accepted, _ = _gate((CAT, 0.4), (CAT, 0.4), (CAT, 0.4))
    assert not accepted


def test_the_threshold_is_strict_and_applies_to_each_classifier() -> None:
    assert not _gate((BIRD, 0.5), (BIRD, 0.9), (BIRD, 0.9))[0]  # exactly 0.5 is not > 0.5
    assert _gate((BIRD, 0.51), (BIRD, 0.9), (BIRD, 0.9)) == (True, BIRD)
    assert not _gate((BIRD, 0.9), (BIRD, 0.9), (BIRD, 0.45))[0]
    assert not _gate((DOG, 0.8), (DOG, 0.8), (DOG, 0.8), threshold=0.85)[0]


def test_gate_works_row_by_row() -> None:
    a = torch.tensor([_vote(CAT, 0.8), _vote(CAT, 0.8), _vote(DOG, 0.9)])
    b = torch.tensor([_vote(CAT, 0.7), _vote(CAT, 0.7), _vote(DOG, 0.6)])
    ab = torch.tensor([_vote(CAT, 0.9), _vote(DOG, 0.9), _vote(DOG, 0.7)])
    g = pseudo_label_gate(a, b, ab)
    assert g.accepted.tolist() == [True, False, True]
    assert g.labels[g.accepted].tolist() == [CAT, DOG]


def test_gate_refuses_mismatched_shapes_and_thresholds() -> None:
    with pytest.raises(ValueError, match=r"\[M, C\]"):
        pseudo_label_gate(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="threshold"):
        pseudo_label_gate(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), threshold=1.0)


# ----------------------------------------------------------------------------- the loss


def test_cross_view_loss_sums_the_classifiers_and_is_zero_on_an_empty_batch() -> None:
    la = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    lb = torch.tensor([[0.0, 0.0], [1.0, 3.0]])
    y = torch.tensor([0, 1])
    expected = (torch.nn.functional.cross_entropy(la, y)
                + torch.nn.functional.cross_entropy(lb, y))
    assert torch.allclose(cross_view_loss((la, lb), y), expected)
    empty = cross_view_loss((torch.zeros(0, 2, requires_grad=True),),
                            torch.zeros(0, dtype=torch.long))
    assert float(empty.detach()) == 0.0
    assert empty.requires_grad
