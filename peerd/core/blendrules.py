"""The robust blend rules as plain data, and their names: ``median``, ``trimmed[:β]``,
``clipped[:τ]``, ``krum[:f]`` (the arithmetic is :mod:`peerd.core.robust`).

Torch-free on purpose: the daemon's config checks a ``blend`` value with :func:`parse_rule`,
and loading a config must not import torch (``peerd status`` would pay seconds for it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Defaults when ``trimmed`` / ``clipped`` / ``krum`` come without a parameter.
DEFAULT_BETA = 0.1
DEFAULT_TAU = 1.0
DEFAULT_F = 1


class RobustError(ValueError):
    """A robust rule cannot be applied as configured (Krum with too few models)."""


@dataclass(frozen=True, slots=True)
class Median:
    def __str__(self) -> str:
        return "median"


@dataclass(frozen=True, slots=True)
class Trimmed:
    beta: float = DEFAULT_BETA  # the fraction cut on EACH side, 0 ≤ β < 0.5

    def __post_init__(self) -> None:
        if not (math.isfinite(self.beta) and 0.0 <= self.beta < 0.5):
            raise ValueError(f"trimmed: beta must be in [0, 0.5), got {self.beta}")

    def __str__(self) -> str:
        return f"trimmed:{self.beta:g}"


@dataclass(frozen=True, slots=True)
class Clipped:
    tau: float = DEFAULT_TAU  # the largest norm of x_j − x_own that is blended unscaled

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tau) and self.tau > 0):
            raise ValueError(f"clipped: tau must be finite and > 0, got {self.tau}")

    def __str__(self) -> str:
        return f"clipped:{self.tau:g}"


@dataclass(frozen=True, slots=True)
class Krum:
    f: int = DEFAULT_F  # how many bad models the selection must survive

    def __post_init__(self) -> None:
        if isinstance(self.f, bool) or not isinstance(self.f, int) or self.f < 0:
            raise ValueError(f"krum:f needs an integer f >= 0, got {self.f!r}")

    def __str__(self) -> str:
        return f"krum:{self.f}"


RobustRule = Median | Trimmed | Clipped | Krum
#: The names ``blend`` accepts (``weighted`` is the plain blend, in :mod:`peerd.core.round`).
RULE_NAMES = ("median", "trimmed", "clipped", "krum")


def parse_rule(text: str) -> RobustRule:
    """``median`` | ``trimmed[:β]`` | ``clipped[:τ]`` | ``krum[:f]`` → a rule (ValueError)."""
    name, sep, arg = text.strip().partition(":")
    if name not in RULE_NAMES:
        raise ValueError(f"unknown blend rule {name!r} (one of weighted, {', '.join(RULE_NAMES)})")
    if not sep:
        defaults: dict[str, RobustRule] = {"median": Median(), "trimmed": Trimmed(),
                                           "clipped": Clipped(), "krum": Krum()}
        return defaults[name]
    if name == "median":
        raise ValueError("median takes no parameter")
    if name == "krum":
        try:
            f = int(arg, 10)
        except ValueError:
            raise ValueError(f"krum:f needs an integer f >= 0, got {arg!r}") from None
        return Krum(f)
    try:
        value = float(arg)
    except ValueError:
        raise ValueError(f"{name}: {arg!r} is not a number") from None
    return Trimmed(value) if name == "trimmed" else Clipped(value)
