"""The §6.1 linear problem of the cordial-learning paper: correlated agents, their ground truth.

Owns the problem generation exactly as §6.1 sets it up: a random correlation matrix R per run
(unit diagonal, off-diagonal (U_ji + U_ij)/2 with U ~ U[−5/N, 5/N], repaired to a nearby
correlation matrix when it is not positive semidefinite), Gaussian or Laplace-marginal inputs
(the Gaussian coordinates mapped through F⁻¹∘Φ, their cross-correlation R̃ computed by
numerical integration), A_i and Λ_j^i* drawn from N(0, 0.5²) or Laplace(0.4), the κ = 0.8
scaling, A_i* by Picard iteration, B_j^i = Λ_j^i* A_j*, noiseless labels.

Shared by the simulator (peerd.sim.cordial_linear: many runs side by side) and the daemon's
sensor task (peerd.learn.sensors: one run, every node drawing the same fleet-wide sample for a
time bucket and keeping its own agent's component). Deterministic from the seed given; no I/O.
The update rule and the losses are :mod:`peerd.core.cordial`'s.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

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
