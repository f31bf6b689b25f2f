"""α policies (§3.6): non-negative, summing to one, errors instead of silent fixes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd.core.alpha import AlphaError, AlphaPolicy, Member, alpha_weights, normalize


def test_raw_6_3_1_normalise_to_0_6_0_3_0_1() -> None:
    assert normalize([6, 3, 1]).tolist() == pytest.approx([0.6, 0.3, 0.1], abs=1e-15)


def test_uniform_is_equal_trust() -> None:
    w = alpha_weights(AlphaPolicy.parse("uniform"), [Member(10, 0), Member(500, 3), Member(1, 9)])
    assert w.tolist() == pytest.approx([1 / 3] * 3)


def test_examples_is_n_over_total() -> None:
    w = alpha_weights(AlphaPolicy.parse("examples"), [Member(180, 0), Member(90, 0), Member(30, 0)])
    assert w.tolist() == pytest.approx([0.6, 0.3, 0.1])


def test_examples_capped_limits_one_large_site() -> None:
    w = alpha_weights(
        AlphaPolicy.parse("examples-capped:100"), [Member(1000, 0), Member(50, 0), Member(50, 0)]
    )
    assert w.tolist() == pytest.approx([0.5, 0.25, 0.25])


def test_staleness_polynomial_matches_fedasync_formula() -> None:
    policy = AlphaPolicy.parse("staleness:poly:0.5")
    w = alpha_weights(policy, [Member(1, 0), Member(1, 3)])
    raw = np.array([1.0, (1 + 3) ** -0.5])
    assert w.tolist() == pytest.approx((raw / raw.sum()).tolist())


def test_staleness_hinge_is_flat_until_b_then_decays() -> None:
    policy = AlphaPolicy.parse("staleness:hinge:10:4")
    w = alpha_weights(policy, [Member(1, 0), Member(1, 4), Member(1, 6)])
    raw = np.array([1.0, 1.0, 1 / (10 * (6 - 4) + 1)])
    assert w.tolist() == pytest.approx((raw / raw.sum()).tolist())


def test_staleness_with_examples_base() -> None:
    policy = AlphaPolicy.parse("staleness:poly:1:examples")
    w = alpha_weights(policy, [Member(300, 0), Member(100, 1)])
    raw = np.array([300.0, 100.0 / 2])
    assert w.tolist() == pytest.approx((raw / raw.sum()).tolist())


@pytest.mark.parametrize(
    "raw", [[1.0, math.nan], [1.0, -0.5], [0.0, 0.0], [], [math.inf, 1.0]]
)
def test_nan_negative_zero_or_empty_raw_weights_are_errors(raw: list[float]) -> None:
    with pytest.raises(AlphaError):
        normalize(raw)


def test_negative_examples_or_bad_staleness_are_errors() -> None:
    with pytest.raises(AlphaError):
        alpha_weights(AlphaPolicy.parse("examples"), [Member(-1, 0)])
    with pytest.raises(AlphaError):
        alpha_weights(AlphaPolicy.parse("uniform"), [Member(1, math.nan)])
    with pytest.raises(AlphaError):
        alpha_weights(AlphaPolicy.parse("examples"), [Member(0, 0), Member(0, 0)])


@pytest.mark.parametrize(
    "spec", ["", "average", "examples-capped", "examples-capped:0", "examples-capped:x",
             "staleness", "staleness:exp:1", "staleness:poly:-1", "staleness:hinge:1",
             "staleness:poly:nan"]
)
def test_unknown_or_malformed_policy_specs_are_refused(spec: str) -> None:
    with pytest.raises(AlphaError):
        AlphaPolicy.parse(spec)


@pytest.mark.parametrize(
    "spec", ["uniform", "examples", "examples-capped:64", "staleness:poly:0.5",
             "staleness:hinge:10:4", "staleness:poly:1:examples"]
)
def test_policy_spec_round_trips(spec: str) -> None:
    assert str(AlphaPolicy.parse(spec)) == spec


members = st.lists(
    st.builds(Member, st.integers(0, 10**6), st.floats(0, 1e6, allow_nan=False)),
    min_size=1, max_size=12,
).filter(lambda ms: any(m.num_examples > 0 for m in ms))
policies = st.sampled_from(
    ["uniform", "examples", "examples-capped:1000", "staleness:poly:0.5",
     "staleness:hinge:10:4", "staleness:poly:2:examples"]
)


@settings(max_examples=300, deadline=None)
@given(ms=members, spec=policies)
def test_alpha_is_nonnegative_and_sums_to_one_within_1e_12(ms: list[Member], spec: str) -> None:
    w = alpha_weights(AlphaPolicy.parse(spec), ms)
    assert w.shape == (len(ms),)
    assert np.all(w >= 0)
    assert abs(math.fsum(w.tolist()) - 1.0) <= 1e-12
