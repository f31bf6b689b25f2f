"""Validation of an entry before it may touch the cache; every failure is a named reason.

The usual guards of weighted aggregation: reject updates that do not fit the local model
(schema, dtype, shape), non-finite values, oversized norms (a blown-up or malicious
update), implausible example counts (they set α), and timestamps from the future (a skewed or
lying clock would otherwise look forever fresh). "Not newer than what I hold" is not a
validation failure: the cache merge drops and counts it separately.

It returns a verdict and never keeps or drops the entry itself; signatures, membership and
replays are checked before it, by ``peerd.protocol.admission``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from peerd.core.entry import Entry, Schema, dtype_name, payload_digest
from peerd.core.limits import ValidationLimits
from peerd.core.reasons import Reason

__all__ = ["Rejection", "RejectionAudit", "ValidationLimits", "validate_entry"]

#: Elements checked per chunk: bounds float64 temporaries to 2 MiB for any model size.
#: Larger chunks were measured to leave ~0.7 × model size of fragmented heap per entry.
_CHUNK = 1 << 18


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: Reason
    detail: str


def _norm_and_finite(t: torch.Tensor) -> tuple[float, bool]:
    flat = t.detach().reshape(-1)
    total = 0.0
    for start in range(0, flat.numel(), _CHUNK):
        chunk = flat[start : start + _CHUNK].double()
        if not bool(torch.isfinite(chunk).all()):
            return math.inf, False
        total += float(torch.dot(chunk, chunk))
    return total, True


def validate_entry(
    entry: Entry,
    expected: Schema,
    limits: ValidationLimits,
    *,
    now: float,
    check_digest: bool = True,
) -> Rejection | None:
    """Return why ``entry`` must be refused, or ``None`` if it may enter the merge."""
    meta = entry.meta
    if meta.schema_id != expected.id:
        return Rejection(Reason.SCHEMA_MISMATCH, f"schema {meta.schema_id[:12]}… != local")
    names = set(entry.params)
    want = {s.name for s in expected.specs}
    if names != want:
        missing, extra = sorted(want - names), sorted(names - want)
        detail = f"tensor set differs: missing {missing} extra {extra}"
        return Rejection(Reason.SHAPE_MISMATCH, detail)
    for spec in expected.specs:
        t = entry.params[spec.name]
        if dtype_name(t.dtype) != spec.dtype:
            return Rejection(Reason.DTYPE_MISMATCH, f"{spec.name}: {t.dtype} != {spec.dtype}")
        if tuple(t.shape) != spec.shape:
            detail = f"{spec.name}: {tuple(t.shape)} != {spec.shape}"
            return Rejection(Reason.SHAPE_MISMATCH, detail)
    if meta.num_examples <= 0:
        return Rejection(Reason.EXAMPLES_NONPOSITIVE, f"num_examples={meta.num_examples}")
    if meta.num_examples > limits.max_examples:
        return Rejection(Reason.EXAMPLES_OVER_CAP, f"num_examples={meta.num_examples}")
    if not math.isfinite(meta.created_at) or meta.created_at > now + limits.max_future_skew_s:
        return Rejection(Reason.FUTURE_TIMESTAMP, f"created_at {meta.created_at} vs now {now}")
    sq = 0.0
    for spec in expected.float_specs:
        part, finite = _norm_and_finite(entry.params[spec.name])
        if not finite:
            return Rejection(Reason.NON_FINITE, f"{spec.name} has NaN or Inf")
        sq += part
    norm = math.sqrt(sq)
    if norm > limits.max_norm:
        return Rejection(Reason.NORM_TOO_LARGE, f"norm {norm:.3g} > {limits.max_norm:g}")
    if check_digest and payload_digest(entry.params) != meta.digest:
        return Rejection(Reason.PAYLOAD_MISMATCH, "tensors do not match the entry's digest")
    return None


class RejectionAudit:
    """Counts refusals by reason for ``peerd status`` and keeps the last few for the log."""

    def __init__(self, keep_last: int = 64) -> None:
        self.counts: Counter[Reason] = Counter()
        self._keep = keep_last
        self.recent: list[tuple[str, Rejection]] = []

    def record(self, origin: str, rejection: Rejection) -> None:
        self.counts[rejection.reason] += 1
        self.recent.append((origin, rejection))
        del self.recent[: -self._keep]

    def add(self, counts: Mapping[Reason, int]) -> None:
        self.counts.update(counts)

    def as_dict(self) -> dict[str, int]:
        return {str(k): v for k, v in sorted(self.counts.items())}
