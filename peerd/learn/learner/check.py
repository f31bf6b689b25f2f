"""What a learner gives back, held against the fleet's schema before peerd uses any of it.

A learner is the user's code: it may return the wrong shapes, a NaN, a negative example
count or a thousand metrics. Each check here refuses such a result with a :class:`Refusal`
reason (raised as :class:`LearnerError`), so the round publishes nothing and the cache stays
as it was. The schema is the fleet model's ``state_dict()``: keys, shapes and dtypes.

Pure: torch only (no files, no processes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from peerd.learn.learner.contract import (
    EvalResult,
    FitResult,
    LearnerError,
    Params,
    Refusal,
)

#: Metrics one result may carry, and the longest name. The names become label values of one
#: Prometheus series each and keys of the status JSON: a learner that emitted a new name per
#: step, or megabyte-long names, would grow the daemon's memory, every scrape and the
#: monitoring server's series without bound.
MAX_METRICS = 32
MAX_METRIC_NAME = 64
#: How much of a learner's error message a refusal keeps (one log line, one status field).
MAX_DETAIL = 200


@dataclass(frozen=True, slots=True)
class Slot:
    """One tensor of the schema."""

    shape: tuple[int, ...]
    dtype: torch.dtype


#: The fleet's schema: state_dict name -> shape and dtype, in state_dict order.
FleetSchema = Mapping[str, Slot]


def schema_of(params: Params) -> dict[str, Slot]:
    """The schema of a model's ``state_dict()`` (or of any name -> tensor mapping)."""
    return {k: Slot(tuple(v.shape), v.dtype) for k, v in params.items()}


def bounded(text: str, limit: int = MAX_DETAIL) -> str:
    """``text`` on one line, at most ``limit`` characters (a learner's message goes into a log
    line and the status)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def raised(exc: BaseException) -> LearnerError:
    """The refusal for an exception in a learner's code: its type and first line."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return LearnerError(Refusal.RAISED, bounded(text))


def _check_keys(names: Mapping[str, object], schema: FleetSchema) -> None:
    missing = [k for k in schema if k not in names]
    extra = [k for k in names if k not in schema]
    if missing or extra:
        what = []
        if missing:
            what.append(f"missing {bounded(', '.join(map(str, missing)), 80)}")
        if extra:
            what.append(f"unexpected {bounded(', '.join(map(str, extra)), 80)}")
        raise LearnerError(Refusal.SCHEMA, "; ".join(what))


def check_schema(got: FleetSchema, schema: FleetSchema) -> None:
    """``got`` (a result's names, shapes and dtypes, or what an external learner says it
    publishes) is ``schema``, else a ``schema`` :class:`LearnerError` naming the first
    difference."""
    _check_keys(got, schema)
    for name, slot in schema.items():
        have = got[name]
        if have.shape != slot.shape or have.dtype != slot.dtype:
            raise LearnerError(Refusal.SCHEMA,
                               f"{name}: {have.shape} {have.dtype}, the fleet's is "
                               f"{slot.shape} {slot.dtype}")


def check_params(params: object, schema: FleetSchema) -> Params:
    """``params`` if it is a name -> tensor mapping in ``schema`` with finite values."""
    if not isinstance(params, Mapping):
        raise LearnerError(Refusal.MALFORMED,
                           f"params must be a mapping of names to tensors, got "
                           f"{type(params).__name__}")
    _check_keys(params, schema)
    for name in schema:
        t = params[name]
        if not isinstance(t, torch.Tensor):
            raise LearnerError(Refusal.MALFORMED,
                               f"{name}: expected a tensor, got {type(t).__name__}")
    check_schema(schema_of(params), schema)
    # After every shape check: the finiteness pass reads every value, the checks above none.
    for name, t in params.items():
        if not finite(t):
            raise LearnerError(Refusal.NON_FINITE, f"{name}: holds NaN or infinity")
    return params


def finite(t: torch.Tensor) -> bool:
    """No NaN and no infinity in ``t`` (integer and bool tensors always pass).

    One read pass, no temporary: the smallest and the largest value (torch's min and max
    propagate NaN) are both finite exactly when every value is. ``isfinite(t).all()`` reads
    the same values but materialises a mask of the tensor's size through several passes:
    ~20× slower for an 11M-parameter model (benchmarks/bench_learner.py).
    """
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return True
    if t.is_complex():
        t = torch.view_as_real(t)
    lo, hi = torch.aminmax(t.detach())
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def check_examples(n: object, *, most: int | None = None) -> int:
    """An example count: an integer >= 0 (and <= ``most``, the count peers accept)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise LearnerError(Refusal.EXAMPLES,
                           f"num_examples must be an integer, got {type(n).__name__}")
    if n < 0:
        raise LearnerError(Refusal.EXAMPLES, f"num_examples must be >= 0, got {n}")
    if most is not None and n > most:
        raise LearnerError(Refusal.EXAMPLES,
                           f"num_examples {n} is above {most}, the most peers accept "
                           "([validation] max_examples)")
    return n


def check_number(value: object, what: str) -> float:
    """A finite real number (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LearnerError(Refusal.MALFORMED,
                           f"{what} must be a number, got {type(value).__name__}")
    x = float(value)
    if not math.isfinite(x):
        raise LearnerError(Refusal.NON_FINITE, f"{what} is {x}")
    return x


def check_metrics(metrics: object) -> dict[str, float]:
    """A small map of short names to finite numbers (see :data:`MAX_METRICS`)."""
    if not isinstance(metrics, Mapping):
        raise LearnerError(Refusal.MALFORMED,
                           f"metrics must be a mapping, got {type(metrics).__name__}")
    if len(metrics) > MAX_METRICS:
        raise LearnerError(Refusal.MALFORMED,
                           f"{len(metrics)} metrics, at most {MAX_METRICS} are kept")
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name or len(name) > MAX_METRIC_NAME \
                or not name.isprintable():
            raise LearnerError(Refusal.MALFORMED,
                               f"metric name {bounded(repr(name), 80)}: must be printable "
                               f"text of 1 to {MAX_METRIC_NAME} characters")
        out[name] = check_number(value, f"metric {name!r}")
    return out


def check_fit(result: object, schema: FleetSchema, *,
              max_examples: int | None = None) -> FitResult:
    """``result`` if it is a :class:`FitResult` peerd may publish, else :class:`LearnerError`.

    Cheap checks first: the example count and metrics before a pass over every parameter."""
    if not isinstance(result, FitResult):
        raise LearnerError(Refusal.MALFORMED,
                           f"fit must return a FitResult, got {type(result).__name__}")
    n = check_examples(result.num_examples, most=max_examples)
    metrics = check_metrics(result.metrics)
    params = check_params(result.params, schema)
    return FitResult(params=params, num_examples=n, metrics=metrics)


def check_eval(result: object) -> EvalResult:
    """``result`` if it is an :class:`EvalResult` with a finite loss, else
    :class:`LearnerError`."""
    if not isinstance(result, EvalResult):
        raise LearnerError(Refusal.MALFORMED,
                           f"evaluate must return an EvalResult, got {type(result).__name__}")
    n = check_examples(result.num_examples)
    metrics = check_metrics(result.metrics)
    loss = check_number(result.loss, "loss")
    return EvalResult(loss=loss, num_examples=n, metrics=metrics)
