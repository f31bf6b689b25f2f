"""Importance weights α for the blend (lecture §3.6): non-negative, summing to one.

Policies (spelled as in the config file and on the command line):

* ``uniform`` — every member equal, the plain average.
* ``examples`` — ``n_j / Σ n``, FedAvg's data-size weighting.
* ``examples-capped:CAP`` — ``min(n_j, CAP)``, so one huge site cannot drown small ones.
* ``staleness:poly:A`` — ``(1 + s)^(−A)`` (FedAsync's polynomial decay).
* ``staleness:hinge:A:B`` — ``1`` while ``s ≤ B``, then ``1 / (A (s − B) + 1)`` (FedAsync hinge).
  Staleness policies multiply the decay into a base weight; append ``:examples`` to use the
  example count as base (``staleness:poly:0.5:examples``), default uniform.

Bad inputs (NaN, negative counts or staleness, all-zero weights) raise :class:`AlphaError`
rather than being silently "fixed": a NaN weight means a bug or an attack upstream.

Numpy only, no torch: ``peerd.daemon.config`` parses policies without loading it. It
weighs the members it is given and never chooses them (:mod:`peerd.core.plan` does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

Weights = npt.NDArray[np.float64]


class AlphaError(ValueError):
    """Raised for weights or policy inputs that cannot yield a valid α."""


@dataclass(frozen=True, slots=True)
class Member:
    """What a policy may look at for one blend member."""

    num_examples: int
    staleness: float  # rounds or seconds, as the clock measures; own model: 0


@dataclass(frozen=True, slots=True)
class AlphaPolicy:
    kind: Literal["uniform", "examples", "examples-capped", "staleness"]
    cap: int = 0
    decay: Literal["poly", "hinge"] = "poly"
    a: float = 0.5
    b: float = 0.0
    base: Literal["uniform", "examples"] = "uniform"

    @classmethod
    def parse(cls, spec: str) -> AlphaPolicy:
        """Parse a policy spec (see the module docstring for the spellings)."""
        parts = spec.strip().split(":")
        try:
            if parts == ["uniform"]:
                return cls("uniform")
            if parts == ["examples"]:
                return cls("examples")
            if parts[0] == "examples-capped" and len(parts) == 2:
                cap = int(parts[1])
                if cap <= 0:
                    raise AlphaError(f"examples-capped needs a positive cap, got {cap}")
                return cls("examples-capped", cap=cap)
            if parts[0] == "staleness" and len(parts) >= 3:
                base: Literal["uniform", "examples"] = "uniform"
                if parts[-1] in ("uniform", "examples"):
                    base = "examples" if parts.pop() == "examples" else "uniform"
                a = float(parts[2])
                if parts[1] == "poly" and len(parts) == 3:
                    policy = cls("staleness", decay="poly", a=a, base=base)
                elif parts[1] == "hinge" and len(parts) == 4:
                    policy = cls("staleness", decay="hinge", a=a, b=float(parts[3]), base=base)
                else:
                    raise AlphaError(f"unknown staleness decay in {spec!r}")
                if not (math.isfinite(policy.a) and policy.a >= 0):
                    raise AlphaError(f"decay exponent must be finite and >= 0: {spec!r}")
                if not (math.isfinite(policy.b) and policy.b >= 0):
                    raise AlphaError(f"hinge offset must be finite and >= 0: {spec!r}")
                return policy
        except ValueError as exc:  # int()/float() parse errors
            if isinstance(exc, AlphaError):
                raise
            raise AlphaError(f"bad number in alpha policy {spec!r}: {exc}") from None
        raise AlphaError(
            f"unknown alpha policy {spec!r} (expected uniform, examples, examples-capped:CAP, "
            "staleness:poly:A or staleness:hinge:A:B)"
        )

    def __str__(self) -> str:
        if self.kind == "examples-capped":
            return f"examples-capped:{self.cap}"
        if self.kind == "staleness":
            tail = f":{self.base}" if self.base == "examples" else ""
            if self.decay == "poly":
                return f"staleness:poly:{self.a:g}{tail}"
            return f"staleness:hinge:{self.a:g}:{self.b:g}{tail}"
        return self.kind


def normalize(raw: Sequence[float] | npt.ArrayLike) -> Weights:
    """Scale non-negative raw scores to sum 1 (6, 3, 1 → 0.6, 0.3, 0.1)."""
    w = np.asarray(raw, dtype=np.float64).reshape(-1)
    if w.size == 0:
        raise AlphaError("no members to weight")
    if not np.all(np.isfinite(w)):
        raise AlphaError(f"non-finite raw weight in {w.tolist()}")
    if np.any(w < 0):
        raise AlphaError(f"negative raw weight in {w.tolist()}")
    total = math.fsum(w.tolist())
    if total <= 0:
        raise AlphaError("raw weights sum to zero")
    out: Weights = w / total
    return out


def staleness_decay(s: float, policy: AlphaPolicy) -> float:
    """FedAsync's s(t − τ): polynomial ``(1+s)^−a`` or hinge (1 up to ``b``, then 1/(a(s−b)+1))."""
    if policy.decay == "poly":
        return float((1.0 + s) ** (-policy.a))
    if s <= policy.b:
        return 1.0
    return 1.0 / (policy.a * (s - policy.b) + 1.0)


def alpha_weights(policy: AlphaPolicy, members: Sequence[Member]) -> Weights:
    """α for ``members`` (in their order) under ``policy``."""
    if not members:
        raise AlphaError("no members to weight")
    for m in members:
        if m.num_examples < 0:
            raise AlphaError(f"negative example count {m.num_examples}")
        if not math.isfinite(m.staleness) or m.staleness < 0:
            raise AlphaError(f"staleness must be finite and >= 0, got {m.staleness}")
    if policy.kind == "uniform":
        raw = [1.0] * len(members)
    elif policy.kind == "examples":
        raw = [float(m.num_examples) for m in members]
    elif policy.kind == "examples-capped":
        raw = [float(min(m.num_examples, policy.cap)) for m in members]
    else:
        base = [
            float(m.num_examples) if policy.base == "examples" else 1.0 for m in members
        ]
        raw = [b * staleness_decay(m.staleness, policy) for b, m in zip(base, members, strict=True)]
    return normalize(raw)
