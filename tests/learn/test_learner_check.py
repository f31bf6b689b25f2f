"""peerd.learn.learner.check: each way a learner's result can be wrong is refused by name."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from peerd.learn.learner.check import (
    MAX_METRIC_NAME,
    MAX_METRICS,
    check_eval,
    check_fit,
    finite,
    raised,
    schema_of,
)
from peerd.learn.learner.contract import EvalResult, FitResult, LearnerError, Refusal

PARAMS = {"w": torch.zeros(3, 2), "b": torch.zeros(3), "steps": torch.zeros((), dtype=torch.int64)}
SCHEMA = schema_of(PARAMS)


def fit(params: Any = None, n: Any = 10, metrics: Any = None) -> FitResult:
    return FitResult(params=dict(PARAMS) if params is None else params,
                     num_examples=n, metrics={} if metrics is None else metrics)


def refusal(result: object, **kwargs: Any) -> LearnerError:
    with pytest.raises(LearnerError) as err:
        check_fit(result, SCHEMA, **kwargs)
    return err.value


def test_a_result_in_the_schema_passes_as_it_is() -> None:
    good = fit(metrics={"train_loss": 0.5, "steps": 3})
    out = check_fit(good, SCHEMA)
    assert out.params["w"] is PARAMS["w"]  # checked, not copied
    assert out.num_examples == 10
    assert out.metrics == {"train_loss": 0.5, "steps": 3.0}


@pytest.mark.parametrize(("params", "says"), [
    ({"w": PARAMS["w"], "b": PARAMS["b"]}, "missing steps"),
    ({**PARAMS, "extra": torch.zeros(1)}, "unexpected extra"),
    ({**PARAMS, "w": torch.zeros(2, 3)}, "w: (2, 3)"),
    ({**PARAMS, "b": torch.zeros(3, dtype=torch.float64)}, "torch.float64"),
])
def test_wrong_keys_shapes_or_dtypes_are_schema(params: dict[str, torch.Tensor],
                                                says: str) -> None:
    err = refusal(fit(params))
    assert err.reason is Refusal.SCHEMA
    assert says in err.detail


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_parameters_are_refused(bad: float) -> None:
    w = torch.zeros(3, 2)
    w[1, 1] = bad
    err = refusal(fit({**PARAMS, "w": w}))
    assert err.reason is Refusal.NON_FINITE
    assert "w" in err.detail


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16,
                                   torch.bfloat16, torch.complex64])
def test_finite_is_exact_for_every_floating_dtype(dtype: torch.dtype) -> None:
    """One min/max pass: every NaN or infinity found wherever it sits (a strided view too),
    and the largest finite values are finite (no overflow, as a sum would have)."""
    good = torch.randn(64, 33).to(dtype)
    assert finite(good)
    real = torch.finfo(good.real.dtype if dtype.is_complex else dtype)
    assert finite(torch.full((5,), real.max, dtype=dtype))
    assert finite(torch.full((5,), real.min, dtype=dtype))
    for bad in (math.nan, math.inf, -math.inf):
        for where in ((0, 0), (63, 32), (17, 5)):
            t = good.clone()
            t[where] = bad
            assert not finite(t)
            assert not finite(t.t())
    assert finite(torch.empty(0, dtype=dtype))
    assert finite(torch.tensor([1, 2]))  # integers: nothing to check


def test_non_finite_metrics_and_losses_are_refused() -> None:
    assert refusal(fit(metrics={"loss": math.nan})).reason is Refusal.NON_FINITE
    with pytest.raises(LearnerError) as err:
        check_eval(EvalResult(loss=math.inf, num_examples=3))
    assert err.value.reason is Refusal.NON_FINITE


@pytest.mark.parametrize("n", [-1, 2.5, "10", True, None])
def test_negative_or_non_integer_example_counts(n: Any) -> None:
    assert refusal(fit(n=n)).reason is Refusal.EXAMPLES


def test_an_example_count_above_what_peers_accept_is_refused() -> None:
    assert check_fit(fit(n=100), SCHEMA, max_examples=100).num_examples == 100
    err = refusal(fit(n=101), max_examples=100)
    assert err.reason is Refusal.EXAMPLES
    assert "max_examples" in err.detail


@pytest.mark.parametrize("result", [None, {"params": PARAMS}, (PARAMS, 3, {})])
def test_something_that_is_not_a_fit_result_is_malformed(result: object) -> None:
    assert refusal(result).reason is Refusal.MALFORMED


@pytest.mark.parametrize("metrics", [
    [("loss", 1.0)],
    {f"m{i}": 1.0 for i in range(MAX_METRICS + 1)},
    {"x" * (MAX_METRIC_NAME + 1): 1.0},
    {"": 1.0},
    {"line\nbreak": 1.0},
    {3: 1.0},
    {"loss": "low"},
    {"loss": True},
    {"loss": [1.0]},
])
def test_metrics_must_be_a_small_map_of_short_names_to_numbers(metrics: Any) -> None:
    assert refusal(fit(metrics=metrics)).reason is Refusal.MALFORMED


def test_the_largest_allowed_metrics_pass() -> None:
    many = {("m" * (MAX_METRIC_NAME - 3)) + f"{i:03d}": float(i) for i in range(MAX_METRICS)}
    assert check_fit(fit(metrics=many), SCHEMA).metrics == many


def test_params_that_are_not_tensors_are_malformed() -> None:
    assert refusal(fit({**PARAMS, "w": [[0.0] * 2] * 3})).reason is Refusal.MALFORMED
    assert refusal(fit(params=[("w", PARAMS["w"])])).reason is Refusal.MALFORMED


def test_eval_results_are_checked_too() -> None:
    ok = check_eval(EvalResult(loss=1, num_examples=4, metrics={"accuracy": 0.5}))
    assert (ok.loss, ok.num_examples, ok.metrics) == (1.0, 4, {"accuracy": 0.5})
    for bad, reason in ((EvalResult(loss="x", num_examples=1), Refusal.MALFORMED),  # type: ignore[arg-type]
                        (EvalResult(loss=1.0, num_examples=-2), Refusal.EXAMPLES),
                        ("EvalResult", Refusal.MALFORMED)):
        with pytest.raises(LearnerError) as err:
            check_eval(bad)
        assert err.value.reason is reason


def test_an_exception_becomes_one_bounded_line_with_its_type() -> None:
    err = raised(ValueError("first line\nsecond line"))
    assert (err.reason, err.detail) == (Refusal.RAISED, "ValueError: first line")
    long = raised(RuntimeError("x" * 5000))
    assert long.detail.startswith("RuntimeError: xxx")
    assert len(long.detail) <= 200
    assert raised(KeyError()).detail == "KeyError"
