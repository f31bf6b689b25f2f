"""Drift: the Euclidean distance between two models (lecture §3.10), and the publish rule.

Accumulated in float64: float32 sums over millions of squared gaps lose digits (and 1e20-sized
values overflow float32), and the ε decision must not flip on rounding.
Both models are only read; which one to measure against (the last published entry) is the
caller's choice (:mod:`peerd.core.round`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from peerd.core.entry import Schema

#: Elements converted to float64 at a time: bounds the temporary to 2 MiB whatever the model
#: size (a daemon computes C + 1 drifts every round, alongside training).
DRIFT_CHUNK = 1 << 18


def flat_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖₂ of two equally shaped tensors, summed in float64 chunk by chunk."""
    if a.shape != b.shape:
        raise ValueError(f"cannot compare shapes {list(a.shape)} and {list(b.shape)}")
    fa, fb = a.detach().reshape(-1), b.detach().reshape(-1)
    total = 0.0
    for start in range(0, fa.numel(), DRIFT_CHUNK):
        # copy=True: .double() of a float64 slice is that slice itself, and sub_ would
        # then overwrite the caller's tensor.
        d = fa[start : start + DRIFT_CHUNK].to(torch.float64, copy=True)
        d.sub_(fb[start : start + DRIFT_CHUNK])  # in place: one float64 temporary, not three
        total += float(torch.dot(d, d))
    return math.sqrt(total)


def row_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """‖a[i] − b[i]‖₂ for every row of two equally shaped ``[N, D]`` matrices: ``[N]`` float64.

    :func:`flat_distance` for a batch of models (the simulator's agents), summed in float64
    over column chunks of at most ``DRIFT_CHUNK`` elements in all."""
    if a.dim() != 2 or a.shape != b.shape:
        raise ValueError(f"need two equal [N, D] matrices, got {list(a.shape)} and "
                         f"{list(b.shape)}")
    fa, fb = a.detach(), b.detach()
    total = torch.zeros(a.shape[0], dtype=torch.float64)
    cols = max(1, DRIFT_CHUNK // max(1, a.shape[0]))
    for start in range(0, a.shape[1], cols):
        d = fa[:, start : start + cols].to(torch.float64, copy=True)  # copy: see flat_distance
        d.sub_(fb[:, start : start + cols])
        total += (d * d).sum(dim=1)
    return total.sqrt()


def drift(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Distance over all floating parameters of two models with the same schema."""
    schema = Schema.of(a)
    if Schema.of(b).id != schema.id:
        raise ValueError("drift is undefined between models of different schemas")
    total = 0.0
    for spec in schema.float_specs:
        total += flat_distance(a[spec.name], b[spec.name]) ** 2
    return math.sqrt(total)


def should_publish(drift_since_last: float, epsilon: float, *, silent_for: float = 0.0,
                   max_silence: float = math.inf) -> bool:
    """Publish a new entry if the model moved more than ε since the last published one, or if
    the last one is ``max_silence`` old.

    ε = 0 means always publish (even with zero drift): "a device whose weights barely moved
    stays silent" applies only when the operator asks for it. Silence is bounded because peers
    drop an entry older than τ_max: a node that barely moves would otherwise vanish from every
    blend instead of its cached copy being reused. ``silent_for`` is the time since the last
    publication, in ``max_silence``'s unit; a negative one (the clock stepped back past it)
    counts as overdue, since the last entry's timestamp is wrong for this clock either way.
    """
    if not math.isfinite(epsilon) or epsilon < 0:
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon}")
    if math.isnan(drift_since_last):
        raise ValueError("drift is NaN")
    if math.isnan(silent_for) or math.isnan(max_silence) or max_silence < 0:
        raise ValueError(f"silence must be a number and its limit >= 0, got {silent_for} of "
                         f"at most {max_silence}")
    if epsilon == 0 or drift_since_last > epsilon:
        return True
    return overdue(silent_for, max_silence)


def overdue(silent_for: float, max_silence: float) -> bool:
    """The last published entry is ``max_silence`` old (or the clock stepped back past it):
    it must be republished even unchanged, or peers age it out of their blends."""
    return silent_for >= max_silence or silent_for < 0
