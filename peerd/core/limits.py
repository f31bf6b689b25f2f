"""Validation limits as plain data, so configuration code can build them cheaply.

Must not import torch: ``peerd.daemon.config`` (and so ``peerd status``) loads it. The
checks that apply these limits are :mod:`peerd.core.validate`'s.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ValidationLimits:
    #: Bound on the float64 L2 norm of all floating parameters. Large enough for real models
    #: (an 11M-parameter net at ~0.05 per weight is ~170), small enough to stop 1e20 poison.
    max_norm: float = 1e4
    #: num_examples sets the α of `examples` policies: cap it so one claim cannot dominate.
    max_examples: int = 10_000_000
    #: How far in the future created_at may be (seconds): tolerates NTP-less clock skew.
    max_future_skew_s: float = 300.0
