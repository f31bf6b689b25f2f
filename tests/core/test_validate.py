"""Validation before anything enters the cache: every failure a named reason."""

from __future__ import annotations

import dataclasses
from typing import TypedDict, Unpack

import pytest
import torch

from peerd.core.alpha import AlphaPolicy, Member, alpha_weights
from peerd.core.blend import blend
from peerd.core.entry import Entry, Schema
from peerd.core.reasons import Reason
from peerd.core.validate import RejectionAudit, ValidationLimits, validate_entry

NOW = 1_700_000_000.0
LIMITS = ValidationLimits(max_norm=100.0, max_examples=1000, max_future_skew_s=60.0)


def params(**over: torch.Tensor) -> dict[str, torch.Tensor]:
    base = {"fc.weight": torch.ones(2, 3), "fc.bias": torch.zeros(2)}
    base.update(over)
    return base


LOCAL = Schema.of(params())


class MetaOverride(TypedDict, total=False):
    """The header fields a test forges after signing; mypy checks them against EntryMeta."""

    schema_id: str
    num_examples: int
    created_at: float


def entry(p: dict[str, torch.Tensor] | None = None, **meta: Unpack[MetaOverride]) -> Entry:
    e = Entry.create(origin="C2", version=3, created_at=NOW - 10, num_examples=50,
                     params=params() if p is None else p)
    return dataclasses.replace(e, meta=dataclasses.replace(e.meta, **meta)) if meta else e


def reason(e: Entry) -> Reason | None:
    r = validate_entry(e, LOCAL, LIMITS, now=NOW)
    return None if r is None else r.reason


def test_a_good_entry_passes() -> None:
    assert reason(entry()) is None


def test_schema_id_differs() -> None:
    assert reason(entry(schema_id="0" * 64)) is Reason.SCHEMA_MISMATCH


def test_tensor_dtype_differs_under_a_forged_schema_id() -> None:
    e = entry(params(**{"fc.bias": torch.zeros(2, dtype=torch.float64)}), schema_id=LOCAL.id)
    assert reason(e) is Reason.DTYPE_MISMATCH


def test_tensor_shape_differs_under_a_forged_schema_id() -> None:
    e = entry(params(**{"fc.bias": torch.zeros(3)}), schema_id=LOCAL.id)
    assert reason(e) is Reason.SHAPE_MISMATCH


def test_missing_or_extra_tensor_under_a_forged_schema_id() -> None:
    p = params(extra=torch.zeros(1))
    assert reason(entry(p, schema_id=LOCAL.id)) is Reason.SHAPE_MISMATCH


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_value(bad: float) -> None:
    w = torch.ones(2, 3)
    w[1, 2] = bad
    assert reason(entry(params(**{"fc.weight": w}))) is Reason.NON_FINITE


def test_norm_above_bound_computed_in_float64_even_when_float32_overflows() -> None:
    # 1e20² overflows float32 to inf; a float32 norm would call this non-finite or wrap.
    huge = torch.full((2, 3), 1e20)
    assert reason(entry(params(**{"fc.weight": huge}))) is Reason.NORM_TOO_LARGE
    just_over = torch.full((2, 3), 100.0 / 6**0.5 + 1e-3)
    assert reason(entry(params(**{"fc.weight": just_over}))) is Reason.NORM_TOO_LARGE
    under = torch.full((2, 3), 100.0 / 6**0.5 - 1e-3)
    assert reason(entry(params(**{"fc.weight": under}))) is None


@pytest.mark.parametrize(("n", "why"), [(0, Reason.EXAMPLES_NONPOSITIVE),
                                         (-5, Reason.EXAMPLES_NONPOSITIVE),
                                         (1001, Reason.EXAMPLES_OVER_CAP)])
def test_implausible_example_counts(n: int, why: Reason) -> None:
    assert reason(entry(num_examples=n)) is why


def test_created_at_beyond_allowed_skew_is_refused_within_it_accepted() -> None:
    assert reason(entry(created_at=NOW + 61)) is Reason.FUTURE_TIMESTAMP
    assert reason(entry(created_at=float("nan"))) is Reason.FUTURE_TIMESTAMP
    assert reason(entry(created_at=NOW + 59)) is None


def test_tensors_that_do_not_match_the_digest_are_refused() -> None:
    e = entry()
    tampered = Entry(e.meta, params(**{"fc.bias": torch.ones(2)}))
    assert reason(tampered) is Reason.PAYLOAD_MISMATCH


def test_audit_counts_by_reason() -> None:
    audit = RejectionAudit(keep_last=2)
    for e in (entry(num_examples=0), entry(num_examples=0), entry(schema_id="0" * 64)):
        r = validate_entry(e, LOCAL, LIMITS, now=NOW)
        assert r is not None
        audit.record(e.meta.origin, r)
    assert audit.as_dict() == {"examples_nonpositive": 2, "schema_mismatch": 1}
    assert len(audit.recent) == 2


# --- fedavg-client-weighting.txt, reproduced with peerd's own validation, α and blend -------
# Its "base" (the checkpoint and preprocessing contract an update was trained from) is what
# peerd's schema id pins down; a packet from another base is refused like a foreign schema.

DEPOTS = [("north-47", 180, (0.20, -0.04)), ("west-62", 90, (-0.10, 0.08)),
          ("east-83", 30, (0.50, -0.02))]


def depot_entry(name: str, examples: int, delta: tuple[float, ...]) -> Entry:
    return Entry.create(origin=name, version=8, created_at=NOW, num_examples=examples,
                        params={"delta": torch.tensor(delta, dtype=torch.float64)})


def test_fedavg_example_weighted_delta_is_0_14_and_minus_0_002() -> None:
    entries = [depot_entry(*d) for d in DEPOTS]
    schema = Schema.of(entries[0].params)
    limits = ValidationLimits(max_norm=10.0)
    assert all(validate_entry(e, schema, limits, now=NOW) is None for e in entries)
    alpha = alpha_weights(AlphaPolicy.parse("examples"),
                          [Member(e.meta.num_examples, 0) for e in entries])
    out = blend([e.params for e in entries], alpha)["delta"]
    assert tuple(round(v, 3) for v in out.tolist()) == (0.14, -0.002)


def test_fedavg_example_wrong_base_and_wrong_shape_are_rejected() -> None:
    good = depot_entry(*DEPOTS[0])
    schema = Schema.of(good.params)
    limits = ValidationLimits(max_norm=10.0)
    other_base = dataclasses.replace(good, meta=dataclasses.replace(good.meta,
                                                                    schema_id="round-7"))
    r = validate_entry(other_base, schema, limits, now=NOW)
    assert r is not None
    assert r.reason is Reason.SCHEMA_MISMATCH
    three_dims = depot_entry("south-1", 40, (0.1, 0.2, 0.3))
    r = validate_entry(three_dims, schema, limits, now=NOW)
    assert r is not None
    assert r.reason is Reason.SCHEMA_MISMATCH
    forged = dataclasses.replace(three_dims, meta=dataclasses.replace(three_dims.meta,
                                                                      schema_id=schema.id))
    r = validate_entry(forged, schema, limits, now=NOW)
    assert r is not None
    assert r.reason is Reason.SHAPE_MISMATCH
    zero = depot_entry("idle-2", 0, (0.1, 0.1))
    r = validate_entry(zero, schema, limits, now=NOW)
    assert r is not None
    assert r.reason is Reason.EXAMPLES_NONPOSITIVE
