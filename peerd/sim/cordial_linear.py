"""The linear experiment of the cordial-learning paper (§6.1), all runs of a configuration at once.

Owns the problem generation exactly as §6.1 sets it up: a random correlation matrix R per run
(unit diagonal, off-diagonal (U_ji + U_ij)/2 with U ~ U[−5/N, 5/N], repaired to a nearby
correlation matrix when it is not positive semidefinite), Gaussian or Laplace-marginal inputs
(the Gaussian coordinates mapped through F⁻¹∘Φ, their cross-correlation R̃ computed by
numerical integration), A_i and Λ_j^i* drawn from N(0, 0.5²) or Laplace(0.4), the κ = 0.8
scaling, A_i* by Picard iteration, B_j^i = Λ_j^i* A_j*, noiseless labels; then the training
loop (cordial and isolated agents side by side, fresh batches every iteration) and the
closed-form loss curves. The update rule and the losses are :mod:`peerd.core.cordial`'s.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.polynomial.hermite_e import hermegauss

from peerd.core import cordial as cl

DISTRIBUTIONS = ("gaussian", "laplace")
D, M_OUT, BATCH, KAPPA = 2, 1, 10, 0.8
#: Parameter draws: N(0, 0.5²) with Gaussian inputs, Laplace(scale 0.4) with Laplace inputs.
GAUSS_STD, LAPLACE_SCALE = 0.5, 0.4
#: Unit-variance Laplace: scale b = 1/√2.
UNIT_LAPLACE_B = 1.0 / math.sqrt(2.0)
Progress = Callable[[int], None]


def draw_correlation(n: int, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    """R with unit diagonal and off-diagonal (U_ji + U_ij)/2, U ~ U[−5/N, 5/N].

    When R is not positive semidefinite its eigenvalues are raised to at least 1e-12 and it
    is rescaled to a unit diagonal; the flag says whether that repair was needed.
    """
    u = rng.uniform(-5.0 / n, 5.0 / n, size=(n, n))
    r = (u + u.T) / 2.0
    np.fill_diagonal(r, 1.0)
    vals, vecs = np.linalg.eigh(r)
    if vals.min() >= 0.0:
        return np.asarray(r, dtype=np.float64), False
    fixed = (vecs * np.maximum(vals, 1e-12)) @ vecs.T
    scale = 1.0 / np.sqrt(np.diag(fixed))
    fixed = fixed * scale[:, None] * scale[None, :]
    np.fill_diagonal(fixed, 1.0)
    return (fixed + fixed.T) / 2.0, True


def _laplace_of_gauss(g: np.ndarray) -> np.ndarray:
    """F⁻¹(Φ(g)) for the unit-variance Laplace F, stable in both tails."""
    log_tail = torch.special.log_ndtr(-torch.from_numpy(np.abs(g)))  # ln Φ(−|g|)
    return np.asarray(np.sign(g) * (-UNIT_LAPLACE_B) * (math.log(2.0) + log_tail.numpy()))


@functools.lru_cache(maxsize=1)
def _laplace_table(points: int = 2001, nodes: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """corr(F⁻¹Φ(g₁), F⁻¹Φ(g₂)) against corr(g₁, g₂) on a grid of [−1, 1].

    Two-dimensional Gauss–Hermite quadrature, normalised by the same quadrature at r = 1 so
    that the unit variance is exact; the grid is fine enough for linear interpolation
    (spacing 0.001, error ~1e-7).
    """
    z, w = hermegauss(nodes)
    w = w / w.sum()
    fz = _laplace_of_gauss(z)
    grid = np.linspace(-1.0, 1.0, points)
    out = np.empty(points)
    for k, r in enumerate(grid):
        g2 = r * z[:, None] + math.sqrt(max(0.0, 1.0 - r * r)) * z[None, :]
        out[k] = float(np.einsum("a,b,a,ab->", w, w, fz, _laplace_of_gauss(g2)))
    return grid, out / out[-1]


def laplace_correlation(r: np.ndarray) -> np.ndarray:
    """R̃: the correlation of the Laplace-mapped coordinates, elementwise from R."""
    grid, table = _laplace_table()
    out = np.interp(r, grid, table)
    np.fill_diagonal(out, 1.0)
    return np.asarray(out)


@dataclass(frozen=True)
class LinearProblem:
    """Every run's ground truth, stacked on a leading run axis (float64)."""

    root: torch.Tensor  # [r, N, N]: any F with F Fᵀ = R, to draw the Gaussian coordinates
    cov: torch.Tensor  # [r, N, N]: Cov(X_j, X_i) = cov[j, i]·I (R, or R̃ for Laplace)
    a: torch.Tensor  # [r, N, m, d]
    lam_star: torch.Tensor  # [r, N, N, m, m], scaled
    a_star: torch.Tensor  # [r, N, m, d]
    b: torch.Tensor  # [r, N, N, m, d]: B[:, i, j] = B_j^i
    m0: torch.Tensor  # initial embeddings
    lam0: torch.Tensor  # initial coordination layers
    laplace: bool
    repaired: int  # runs whose R needed the PSD repair

    def sample(self, batch: int, gen: torch.Generator) -> torch.Tensor:
        """Inputs X [r, batch, N, d]: coordinates independent, agents correlated by R."""
        runs, n, _ = self.root.shape
        g = torch.randn(runs, batch, n, self.a.shape[-1], generator=gen, dtype=torch.float64)
        x = torch.einsum("rnk,rbkd->rbnd", self.root, g)
        if self.laplace:
            # F⁻¹(Φ(g)) = −b·sign(g)·ln(2Φ(−|g|)) = −b·sign(g)·ln erfc(|g|/√2); erfc is
            # faster than log_ndtr and exact to 1e-15 until |g| ≈ 37, where the clamp holds.
            tail = torch.special.erfc(x.abs() / math.sqrt(2.0)).clamp_min(1e-300)
            x = torch.sign(x) * (-UNIT_LAPLACE_B) * torch.log(tail)
        return x

    def labels(self, x: torch.Tensor) -> torch.Tensor:
        """Y_i = A_i X_i + Σ_{j≠i} B_j^i X_j (σ² = 0)."""
        return torch.einsum("rnad,rbnd->rbna", self.a, x) + torch.einsum(
            "rijad,rbjd->rbia", self.b, x)


def make_problem(n: int, distribution: str, runs: int, seed: int) -> LinearProblem:
    """``runs`` independent draws of §6.1's setup (each run: new R, parameters and init)."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {distribution!r} (gaussian or laplace)")
    laplace = distribution == "laplace"
    roots, covs, a_s, lams, m0s, lam0s = [], [], [], [], [], []
    repaired = 0
    off = 1.0 - np.eye(n)
    for run in range(runs):
        rng = np.random.default_rng([seed, n, int(laplace), run])
        corr, fixed = draw_correlation(n, rng)
        repaired += fixed
        vals, vecs = np.linalg.eigh(corr)
        roots.append(vecs * np.sqrt(np.maximum(vals, 0.0)))
        covs.append(laplace_correlation(corr) if laplace else corr)

        def draw(*shape: int, rng: np.random.Generator = rng) -> np.ndarray:
            if laplace:
                return rng.laplace(0.0, LAPLACE_SCALE, size=shape)
            return rng.normal(0.0, GAUSS_STD, size=shape)

        a_s.append(draw(n, M_OUT, D))
        lams.append(draw(n, n, M_OUT, M_OUT) * off[:, :, None, None])
        m0s.append(draw(n, M_OUT, D))
        lam0s.append(draw(n, n, M_OUT, M_OUT) * off[:, :, None, None])

    def stack(xs: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.stack(xs)).to(torch.float64)

    cov, a, lam = stack(covs), stack(a_s), stack(lams)
    lam = lam * cl.coordination_scale(lam, cov, KAPPA)[:, :, None, None, None]
    a_star = cl.picard_fixed_point(a, lam, cov)
    b = torch.einsum("rijab,rjbd->rijad", lam, a_star)
    return LinearProblem(stack(roots), cov, a, lam, a_star, b, stack(m0s), stack(lam0s),
                         laplace, repaired)


def eval_points(iterations: int) -> list[int]:
    """Every iteration up to 200 (the 20- and 140-iteration checks), then ~60 per decade."""
    pts = set(range(min(iterations, 200) + 1))
    if iterations > 200:
        pts.update(round(v) for v in np.geomspace(200, iterations, 1 + int(
            60 * math.log10(iterations / 200))))
    pts.add(iterations)
    return sorted(pts)


@dataclass(frozen=True)
class LinearCurves:
    """Agent-averaged losses [runs, len(points)] at the evaluation points."""

    n: int
    distribution: str
    points: list[int]
    cordial: np.ndarray
    isolated: np.ndarray
    best_isolated: np.ndarray  # [runs]: ‖Y_i − A_i* X_i‖², the isolated optimum
    repaired: int


def run_linear(
    n: int, distribution: str, runs: int, iterations: int, seed: int,
    progress: Progress | None = None, steps: cl.StepSizes | None = None,
) -> LinearCurves:
    """Cordial (Algorithm 1) and isolated agents, ``runs`` runs side by side."""
    steps = steps or cl.StepSizes()
    prob = make_problem(n, distribution, runs, seed)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + n * 2 + int(prob.laplace))
    m, lam, m_iso = prob.m0.clone(), prob.lam0.clone(), prob.m0.clone()
    points = eval_points(iterations)
    wanted = set(points)
    cord: list[np.ndarray] = []
    iso: list[np.ndarray] = []

    def record() -> None:
        cord.append(cl.cordial_loss(m, lam, prob.a, prob.b, prob.cov).mean(1).numpy())
        iso.append(cl.isolated_loss(m_iso, prob.a, prob.b, prob.cov).mean(1).numpy())

    for it in range(iterations + 1):
        if it in wanted:
            record()
        if it == iterations:
            break
        x = prob.sample(2 * BATCH, gen)
        x0, x1 = x[:, :BATCH], x[:, BATCH:]
        y0 = prob.labels(x0)
        m_next, lam = cl.cordial_step(m, lam, x0, y0, x1, it, steps)
        m_iso = cl.isolated_step(m_iso, x0, y0, it, steps)
        m = m_next
        if progress is not None:
            progress(1)
    best = cl.isolated_loss(prob.a_star, prob.a, prob.b, prob.cov).mean(1).numpy()
    return LinearCurves(n, distribution, points, np.stack(cord, 1), np.stack(iso, 1), best,
                        prob.repaired)


def summarise(c: LinearCurves) -> dict[str, Any]:
    """The numbers §6.1 reports, for one configuration."""
    pts = np.asarray(c.points)
    runs = c.cordial.shape[0]
    ratio = c.cordial[:, -1] / c.isolated[:, -1]
    lower = c.cordial < c.isolated
    out: dict[str, Any] = {
        "n": c.n, "distribution": c.distribution, "runs": runs, "iterations": int(pts[-1]),
        "median_ratio_final": float(np.median(ratio)),
        "max_ratio_final": float(ratio.max()),
        "median_cordial_final": float(np.median(c.cordial[:, -1])),
        "median_isolated_final": float(np.median(c.isolated[:, -1])),
        "median_best_isolated": float(np.median(c.best_isolated)),
        "psd_repaired_runs": c.repaired,
    }
    if pts[-1] >= 20:
        out["lower_at_20"] = int(lower[:, list(pts).index(20)].sum())
    if pts[-1] >= 140:
        out["lower_from_140_on"] = int(lower[:, pts >= 140].all(1).sum())
    if pts[-1] >= 100:
        excess = np.median(c.isolated[:, pts >= 100], 0) / np.median(c.best_isolated) - 1.0
        out["isolated_max_median_excess_from_100"] = float(excess.max())
    lo, hi = (2000, 20000) if pts[-1] >= 20000 else (max(1, pts[-1] // 10), pts[-1])
    sel = (pts >= lo) & (pts <= hi)
    if sel.sum() >= 2:
        med = np.median(c.cordial[:, sel], 0)
        out["slope"] = float(np.polyfit(np.log(pts[sel]), np.log(med), 1)[0])
        out["slope_range"] = [int(lo), int(hi)]
    return out
