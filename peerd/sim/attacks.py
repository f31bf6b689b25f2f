"""Poisoning attacks in the simulator (``peerd sim --attack KIND[:PARAM] --attackers FRACTION``).

Attackers are a seeded subset of the agents (:func:`attacker_set`). They run the protocol like
everyone else: they blend, train, and publish one entry per round under their own origin with
the round's version, so caches take them in exactly as they take honest entries (a valid key
proves who sent an entry, not that it is good). Only what they publish differs. Every attack
is written in the frame of the *update*: agent a's blend x̄_a (the model its round started
from) and its honest training result x_a give Δ_a = x_a − x̄_a, and an attacker publishes
x̄_a + δ_a:

* ``sign-flip[:s]`` (default s = 4): δ = −s·Δ_a, the negated update scaled by s. The negated
  *update* rather than the negated *model* −x: models are exchanged, and their common part
  (everything learnt so far) is not the attack; −x mostly rescales a ReLU/linear classifier,
  whose argmax does not care. s = 4 follows the sign-flipping attack's σ = −4 in Li et al.,
  "RSA" (AAAI 2019); s = 1 is the "bit-flipping" attack of Karimireddy et al. and of He et al.
  (ClippedGossip, 2022). With a fraction p of the blend poisoned, the weighted blend's net
  step is (1 − p)·Δ − p·s·Δ: s = 4 stalls it at p = 0.2.
* ``gaussian[:k]`` (default k = 1): δ ~ N(0, σ²·I) with σ = k·‖Δ_a‖/√D, noise of the honest
  update's own scale (D = parameters), drawn from a generator seeded by (seed, round).
* ``label-flip``: the attacker trains on its own data with labels y → (classes − 1) − y
  (9 − y on MNIST) and publishes that model, as it is (:func:`flipped_labels`).
* ``alie[:z]``: "a little is enough" (Baruch et al., NeurIPS 2019): δ = μ − z·σ, μ and σ the
  coordinate-wise mean and standard deviation of the *honest* agents' updates this round, z
  from the paper's formula (:func:`alie_z`) unless given.
* ``ipm[:ε]`` (default ε = 0.1): inner-product manipulation (Xie et al., UAI 2020):
  δ = −ε·μ, μ the mean honest update this round; ε = 0.1 is the paper's choice against
  median and Krum.

ALIE and IPM are **omniscient and colluding**: they read every honest agent's update of the
round (a strong attacker; a real one sees only its neighbours' entries, later). Owns only the
attack models; it must not blend, train or decide anything of a round (:mod:`peerd.sim.runner`
calls :meth:`Threat.publish` between training and publishing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import torch

ATTACKS = ("none", "sign-flip", "gaussian", "label-flip", "alie", "ipm")
#: Defaults when an attack comes without its parameter (ALIE's z comes from its formula).
DEFAULT_SIGN_FLIP_SCALE = 4.0
DEFAULT_GAUSSIAN_SCALE = 1.0
DEFAULT_IPM_EPSILON = 0.1
#: Mixed into the run's seed so that choosing attackers draws nothing from the run's other
#: streams (data split, init, mobility): ``--attack none`` stays the run it always was.
_ATTACKER_STREAM = 0xA77AC


@dataclass(frozen=True, slots=True)
class Attack:
    kind: str = "none"
    param: float | None = None  # None: the kind's default (ALIE: its formula)

    def __str__(self) -> str:
        return self.kind if self.param is None else f"{self.kind}:{self.param:g}"


def parse_attack(text: str) -> Attack:
    """``none`` | ``sign-flip[:s]`` | ``gaussian[:k]`` | ``label-flip`` | ``alie[:z]`` |
    ``ipm[:ε]`` → an :class:`Attack` (ValueError naming what is wrong)."""
    kind, sep, arg = text.strip().partition(":")
    if kind not in ATTACKS:
        raise ValueError(f"unknown attack {kind!r} ({', '.join(ATTACKS)})")
    if not sep:
        return Attack(kind)
    if kind in ("none", "label-flip"):
        raise ValueError(f"attack {kind} takes no parameter")
    try:
        value = float(arg)
    except ValueError:
        raise ValueError(f"attack {kind}: {arg!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and kind != "alie"):
        raise ValueError(f"attack {kind}: the parameter must be finite and > 0, got {arg!r}")
    return Attack(kind, value)


def attacker_count(agents: int, fraction: float) -> int:
    """How many of ``agents`` attack: ``round(fraction · agents)`` (ValueError if that leaves
    no attacker for a positive fraction, or no honest agent)."""
    if not (math.isfinite(fraction) and 0.0 <= fraction < 1.0):
        raise ValueError(f"attackers must be a fraction in [0, 1), got {fraction}")
    count = round(fraction * agents)
    if fraction > 0 and count == 0:
        raise ValueError(f"attackers {fraction} of {agents} agents is no agent; raise it")
    if count >= agents:
        raise ValueError(f"attackers {fraction} of {agents} agents leaves no honest agent")
    return count


def attacker_set(agents: int, fraction: float, seed: int) -> np.ndarray:
    """The attackers' indices (sorted), a seeded draw of :func:`attacker_count` agents."""
    count = attacker_count(agents, fraction)
    rng = np.random.default_rng(np.random.SeedSequence([seed, _ATTACKER_STREAM]))
    return np.sort(rng.choice(agents, size=count, replace=False)).astype(np.int64)


def alie_z(n: int, m: int) -> float:
    """Baruch et al.'s z_max: s = ⌊n/2 + 1⌋ − m supporters needed, z = Φ⁻¹((n − s)/n)."""
    s = math.floor(n / 2 + 1) - m
    return NormalDist().inv_cdf((n - s) / n)


def flipped_labels(y: torch.Tensor, parts: list[np.ndarray], attackers: np.ndarray,
                   num_classes: int) -> torch.Tensor:
    """``y`` with every attacker's own samples relabelled ``classes − 1 − y`` (a copy).

    Agents' index sets are disjoint (:func:`peerd.learn.data.partition`), so flipping an
    attacker's samples changes no honest agent's data."""
    out = y.clone()
    for a in attackers.tolist():
        idx = torch.from_numpy(parts[a])
        out[idx] = (num_classes - 1) - out[idx]
    return out


@dataclass(frozen=True)
class Threat:
    """One run's attack: who attacks and how; applied to each round's trained matrix."""

    attack: Attack
    attackers: np.ndarray  # sorted agent indices
    agents: int
    seed: int

    @property
    def honest(self) -> np.ndarray:
        """The honest agents' indices (what accuracy is measured over)."""
        return np.setdiff1d(np.arange(self.agents), self.attackers)

    @property
    def active(self) -> bool:
        return self.attack.kind != "none" and len(self.attackers) > 0

    def honest_rows(self, matrix: torch.Tensor) -> torch.Tensor:
        """The honest agents' rows of ``matrix`` (``matrix`` itself when nobody attacks)."""
        if not self.active:
            return matrix
        rows: torch.Tensor = matrix[torch.from_numpy(self.honest)]
        return rows

    def publish(self, trained: torch.Tensor, anchors: torch.Tensor, t: int) -> torch.Tensor:
        """What every agent publishes in round ``t``: honest rows of ``trained`` as they are,
        attackers' rows poisoned. ``anchors`` are the blends the round trained from (x̄)."""
        kind = self.attack.kind
        if not self.active or kind == "label-flip":  # label-flip poisoned the training
            return trained
        bad = torch.from_numpy(self.attackers)
        delta = trained.to(torch.float64) - anchors.to(torch.float64)
        out = trained.clone()
        poison = anchors[bad].to(torch.float64) + self._deltas(delta, bad, t)
        out[bad] = poison.to(trained.dtype)
        return out

    def _deltas(self, delta: torch.Tensor, bad: torch.Tensor, t: int) -> torch.Tensor:
        """The attackers' published updates δ, ``[m, D]`` float64."""
        kind, param = self.attack.kind, self.attack.param
        own = delta[bad]
        if kind == "sign-flip":
            return -(DEFAULT_SIGN_FLIP_SCALE if param is None else param) * own
        if kind == "gaussian":
            k = DEFAULT_GAUSSIAN_SCALE if param is None else param
            sigma = k * own.norm(dim=1, keepdim=True) / math.sqrt(own.shape[1])
            g = torch.Generator().manual_seed(
                int(np.random.SeedSequence([self.seed, _ATTACKER_STREAM, t]).generate_state(1)[0]))
            noise: torch.Tensor = sigma * torch.randn(own.shape, generator=g, dtype=torch.float64)
            return noise
        honest = delta[torch.from_numpy(self.honest)]
        mean = honest.mean(dim=0, keepdim=True)
        if kind == "ipm":
            eps = DEFAULT_IPM_EPSILON if param is None else param
            return (-eps * mean).expand(len(bad), -1)
        if kind == "alie":
            z = alie_z(self.agents, len(self.attackers)) if param is None else param
            # Population std (ddof 0): a single honest agent has spread 0, not NaN.
            std = honest.std(dim=0, unbiased=False, keepdim=True)
            return (mean - z * std).expand(len(bad), -1)
        raise AssertionError(f"unhandled attack {kind!r}")  # parse_attack admits no other


def threat_of(attack: str, fraction: float, agents: int, seed: int) -> Threat:
    """A run's :class:`Threat` from its options (ValueError: a bad name or fraction, an attack
    without attackers, or attackers without an attack)."""
    parsed = parse_attack(attack)
    attackers = attacker_set(agents, fraction, seed)
    if parsed.kind == "none" and len(attackers):
        raise ValueError("--attackers needs an --attack")
    if parsed.kind != "none" and not len(attackers):
        raise ValueError(f"--attack {parsed} needs --attackers FRACTION > 0")
    return Threat(parsed, attackers, agents, seed)
