"""Cordial learning's linear core (peerd/core/cordial.py) against hand-computed steps, a literal
per-sample transcription of Algorithm 1, Monte Carlo expectations, and the paper's numbers."""

from __future__ import annotations

import math

import pytest
import torch

from peerd.core import cordial as cl

D64 = torch.float64


def t(values: object) -> torch.Tensor:
    return torch.tensor(values, dtype=D64)


def hand_case() -> tuple[torch.Tensor, ...]:
    """N = 2, d = m = 1, B = 2: the worked step in the test below."""
    m = t([[[[1.0]], [[2.0]]]])  # M_1 = 1, M_2 = 2
    lam = t([[[[[0.0]], [[0.5]]], [[[-1.0]], [[0.0]]]]])  # Λ_2^1 = 0.5, Λ_1^2 = -1
    x0 = t([[[[1.0], [2.0]], [[-1.0], [1.0]]]])  # samples l1 = (1, 2), l2 = (-1, 1)
    y0 = t([[[[0.0], [1.0]], [[1.0], [0.0]]]])
    x1 = t([[[[2.0], [1.0]], [[0.0], [3.0]]]])
    return m, lam, x0, y0, x1


def test_one_step_by_hand() -> None:
    # Leave-one-out with B = 2 is the other sample: agent 1 residualises M_2 X_2 as
    # l1: 4 - (2)(-1)(1) = 6, l2: 2 - (4)(1)(-1) = 6; agent 2: l1: 1 - (-1)(1)(2) = 3, l2: -3.
    # B_t^1 gives M_2 R̃_{2,1}^1 = (2·2 + 6·0)/2 = 2 and M_1 R̃_{1,1}^2 = (2·1 + 0·3)/2 = 1, so
    # M_2 Z̃_{2,1}^1 = (2, 4) and M_1 Z̃_{1,1}^2 = (-1, -2).
    # Residuals: agent 1 (4, 1), agent 2 (0, 5). g_M = (3, 5), g_Λ_2^1 = 12, g_Λ_1^2 = -10.
    m, lam, x0, y0, x1 = hand_case()
    e0, e1 = cl.embedded(m, x0), cl.embedded(m, x1)
    mz0, mz1 = cl.local_variables(e0, x0, e1, x1)
    assert mz0[0, :, 0, 1, 0].tolist() == [6.0, 6.0]
    assert mz0[0, :, 1, 0, 0].tolist() == [3.0, -3.0]
    assert mz1[0, :, 0, 1, 0].tolist() == [2.0, 4.0]
    assert mz1[0, :, 1, 0, 0].tolist() == [-1.0, -2.0]
    g_m, g_lam = cl.gradients(m, lam, x0, y0, x1, radius=1.0)
    assert g_m.flatten().tolist() == [3.0, 5.0]
    assert g_lam[0, 0, 1].item() == 12.0
    assert g_lam[0, 1, 0].item() == -10.0
    new_m, new_lam = cl.cordial_step(m, lam, x0, y0, x1, 0, cl.StepSizes())
    # ε(0) = 0.1, η(0) = 0.05: M = (1 - 0.3, 2 - 0.5), Λ_2^1 = 0.5 - 0.6, Λ_1^2 = -1 + 0.5.
    assert new_m.flatten().tolist() == pytest.approx([0.7, 1.5])
    assert new_lam[0, 0, 1].item() == pytest.approx(-0.1)
    assert new_lam[0, 1, 0].item() == pytest.approx(-0.5)
    assert new_lam[0, 0, 0].item() == 0.0
    assert new_lam[0, 1, 1].item() == 0.0


def test_projection_enters_the_m_gradient_only() -> None:
    # Radius 0.25: Π(Λ_2^1) = 0.25, Π(Λ_1^2) = -0.25. Agent 2's residuals become
    # (4 - 0.75 - 1, 2 + 0.75) = (2.25, 2.75), so g_M2 = 2.25·2 + 2.75·1 = 7.25; g_Λ keeps Λ.
    m, lam, x0, y0, x1 = hand_case()
    g_m, g_lam = cl.gradients(m, lam, x0, y0, x1, radius=0.25)
    assert g_m.flatten().tolist() == pytest.approx([3.0, 7.25])
    assert g_lam[0, 0, 1].item() == 12.0
    assert g_lam[0, 1, 0].item() == -10.0


def literal_gradients(
    m: torch.Tensor, lam: torch.Tensor, x0: torch.Tensor, y0: torch.Tensor, x1: torch.Tensor,
    radius: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Equations (8), (10), (12) sample by sample, agent by agent (run 0 only)."""
    _, b, n, _ = x0.shape
    g_m = torch.zeros_like(m[0])
    g_lam = torch.zeros_like(lam[0])
    lp = cl.project(lam, radius)[0]
    for i in range(n):
        for s in range(b):
            def mz(j: int, s: int = s, i: int = i) -> tuple[torch.Tensor, torch.Tensor]:
                r0 = torch.stack([torch.outer(x0[0, k, j], x0[0, k, i])
                                  for k in range(b) if k != s]).sum(0) / (b - 1)
                r1 = torch.stack([torch.outer(x1[0, k, j], x1[0, k, i])
                                  for k in range(b)]).sum(0) / b
                z0 = x0[0, s, j] - r0 @ x0[0, s, i]
                z1 = x0[0, s, j] - r1 @ x0[0, s, i]
                return m[0, j] @ z0, m[0, j] @ z1

            xi, yi = x0[0, s, i], y0[0, s, i]
            peers = [j for j in range(n) if j != i]
            msg_p = sum((lp[i, k] @ mz(k)[0] for k in peers), torch.zeros_like(yi))
            msg = sum((lam[0, i, k] @ mz(k)[0] for k in peers), torch.zeros_like(yi))
            g_m[i] += 2 * torch.outer(m[0, i] @ xi + msg_p - yi, xi) / b
            for j in peers:
                g_lam[i, j] += 2 * torch.outer(m[0, i] @ xi + msg - yi, mz(j)[1]) / b
    return g_m, g_lam


def test_batched_gradients_match_the_literal_algorithm() -> None:
    gen = torch.Generator().manual_seed(3)
    n, d, mm, b = 3, 2, 2, 4
    m = torch.randn(1, n, mm, d, generator=gen, dtype=D64)
    lam = torch.randn(1, n, n, mm, mm, generator=gen, dtype=D64) * (1 - torch.eye(n, dtype=D64))[
        None, :, :, None, None]
    x0 = torch.randn(1, b, n, d, generator=gen, dtype=D64)
    y0 = torch.randn(1, b, n, mm, generator=gen, dtype=D64)
    x1 = torch.randn(1, b, n, d, generator=gen, dtype=D64)
    want_m, want_lam = literal_gradients(m, lam, x0, y0, x1, radius=0.7)
    got_m, got_lam = cl.gradients(m, lam, x0, y0, x1, radius=0.7)
    torch.testing.assert_close(got_m[0], want_m)
    torch.testing.assert_close(got_lam[0], want_lam)


def small_problem(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """N = 3, d = 2, m = 2 with coordinate-wise correlations and Assumption 1 holding."""
    n, d, mm = 3, 2, 2
    corr = t([[1.0, 0.4, -0.3], [0.4, 1.0, 0.2], [-0.3, 0.2, 1.0]])[None]
    a = torch.randn(1, n, mm, d, generator=gen, dtype=D64) * 0.5
    lam_star = torch.randn(1, n, n, mm, mm, generator=gen, dtype=D64) * 0.5
    lam_star = lam_star * (1 - torch.eye(n, dtype=D64))[None, :, :, None, None]
    lam_star = lam_star * cl.coordination_scale(lam_star, corr)[:, :, None, None, None]
    a_star = cl.picard_fixed_point(a, lam_star, corr)
    b = torch.einsum("rijab,rjbd->rijad", lam_star, a_star)
    return {"corr": corr, "a": a, "lam_star": lam_star, "a_star": a_star, "b": b}


def draw(p: dict[str, torch.Tensor], runs: int, b: int, gen: torch.Generator) -> tuple[
        torch.Tensor, torch.Tensor]:
    chol = torch.linalg.cholesky(p["corr"][0])
    n, d = chol.shape[0], p["a"].shape[-1]
    g = torch.randn(runs, b, n, d, generator=gen, dtype=D64)
    x = torch.einsum("nk,rbkd->rbnd", chol, g)
    lab = torch.einsum("nad,rbnd->rbna", p["a"][0], x)
    lab = lab + torch.einsum("ijad,rbjd->rbia", p["b"][0], x)
    return x, lab


def test_stochastic_gradients_are_unbiased() -> None:
    # Lemma 3: E g_M = 2(M - A*) and E g_Λ = 2 Σ_k (Λ_k^i M_k - B_k^i) C_kj M_jᵀ, whatever
    # M and Λ are. 40,000 independent batches (the run axis) at one random point.
    gen = torch.Generator().manual_seed(11)
    p = small_problem(gen)
    runs, n = 40_000, 3
    m = torch.randn(1, n, 2, 2, generator=gen, dtype=D64)
    lam = torch.randn(1, n, n, 2, 2, generator=gen, dtype=D64) * 0.4
    lam = lam * (1 - torch.eye(n, dtype=D64))[None, :, :, None, None]
    x0, y0 = draw(p, runs, 5, gen)
    x1, _ = draw(p, runs, 5, gen)
    g_m, g_lam = cl.gradients(m.expand(runs, -1, -1, -1), lam.expand(runs, -1, -1, -1, -1),
                              x0, y0, x1, radius=1e9)
    want_m, want_lam = cl.expected_gradients(m, lam, p["a"], p["b"], p["corr"])
    se_m = g_m.std(0) / math.sqrt(runs)
    se_lam = g_lam.std(0) / math.sqrt(runs)
    assert ((g_m.mean(0) - want_m[0]).abs() <= 5 * se_m + 1e-12).all()
    assert ((g_lam.mean(0) - want_lam[0]).abs() <= 5 * se_lam + 1e-12).all()
    # And the point is not a trivial one: the expected gradients are far from zero.
    assert want_m.abs().max() > 20 * se_m.max()


def test_the_optimum_has_zero_gradient_and_zero_loss() -> None:
    gen = torch.Generator().manual_seed(5)
    p = small_problem(gen)
    g_m, g_lam = cl.expected_gradients(p["a_star"], p["lam_star"], p["a"], p["b"], p["corr"])
    assert g_m.abs().max() < 1e-12
    assert g_lam.abs().max() < 1e-12
    loss = cl.cordial_loss(p["a_star"], p["lam_star"], p["a"], p["b"], p["corr"])
    assert loss.abs().max() < 1e-12
    # A_i* is also the best isolated model: any move away raises loss (4).
    best = cl.isolated_loss(p["a_star"], p["a"], p["b"], p["corr"])
    assert (best > 1e-3).all()  # the peers' inputs carry what agent i alone cannot predict
    for _ in range(5):
        delta = torch.randn(p["a"].shape, generator=gen, dtype=D64) * 0.1
        assert (cl.isolated_loss(p["a_star"] + delta, p["a"], p["b"], p["corr"]) > best).all()
    # Away from the optimum the expected gradient is not zero.
    g_m, _ = cl.expected_gradients(p["a_star"] + 0.1, p["lam_star"], p["a"], p["b"], p["corr"])
    assert g_m.abs().min() > 0.19


def test_closed_form_losses_match_monte_carlo() -> None:
    gen = torch.Generator().manual_seed(8)
    p = small_problem(gen)
    n = 3
    m = p["a_star"] + 0.3 * torch.randn(p["a"].shape, generator=gen, dtype=D64)
    lam = p["lam_star"] + 0.2 * torch.randn(p["lam_star"].shape, generator=gen, dtype=D64)
    lam = lam * (1 - torch.eye(n, dtype=D64))[None, :, :, None, None]
    x, y = draw(p, 1, 200_000, gen)
    corr = p["corr"][0]
    iso = ((y - cl.embedded(m, x)) ** 2).sum(-1).mean(1)[0]
    torch.testing.assert_close(cl.isolated_loss(m, p["a"], p["b"], p["corr"])[0], iso,
                               rtol=0.02, atol=0.0)
    pred = cl.embedded(m, x)[0]  # M_i X_i
    for i in range(n):
        for k in range(n):
            if k != i:
                z = x[0, :, k] - corr[k, i] * x[0, :, i]
                pred[:, i] += z @ (lam[0, i, k] @ m[0, k]).T
    mc = ((y[0] - pred) ** 2).sum(-1).mean(0)
    torch.testing.assert_close(cl.cordial_loss(m, lam, p["a"], p["b"], p["corr"])[0], mc,
                               rtol=0.02, atol=0.0)


def test_picard_fixed_point_solves_the_linear_system() -> None:
    gen = torch.Generator().manual_seed(2)
    p = small_problem(gen)
    scale_ok = cl.coordination_scale(p["lam_star"], p["corr"])  # already scaled: s_i = 1
    assert torch.allclose(scale_ok, torch.ones_like(scale_ok))
    # A* = A + Σ_j B_j^i C_ji with B = Λ* A*: the fixed point satisfies Assumption 1.
    torch.testing.assert_close(cl.optimal_isolated(p["a"], p["b"], p["corr"]), p["a_star"])


def test_kappa_scaling_bounds_gamma() -> None:
    gen = torch.Generator().manual_seed(4)
    n = 6
    corr = torch.full((1, n, n), 0.5, dtype=D64) + 0.5 * torch.eye(n, dtype=D64)
    lam = torch.randn(1, n, n, 1, 1, generator=gen, dtype=D64) * 3
    lam = lam * (1 - torch.eye(n, dtype=D64))[None, :, :, None, None]
    s = cl.coordination_scale(lam, corr, kappa=0.8)
    gamma = (lam.abs()[..., 0, 0] * 0.5).sum(-1)
    torch.testing.assert_close(s, torch.clamp(0.8 / gamma, max=1.0))
    scaled = lam * s[:, :, None, None, None]
    assert ((scaled.abs()[..., 0, 0] * 0.5).sum(-1) <= 0.8 + 1e-12).all()


def test_picard_refuses_a_non_contraction() -> None:
    corr = t([[[1.0, 0.9], [0.9, 1.0]]])
    lam = t([[[[[0.0]], [[2.0]]], [[[2.0]], [[0.0]]]]])  # γ = 1.8 > 1: diverges
    with pytest.raises(ValueError, match="did not converge"):
        cl.picard_fixed_point(t([[[[1.0]], [[1.0]]]]), lam, corr, max_iter=200)


def test_appendix_b_two_scalar_agents() -> None:
    # Y1 = X2, Y2 = X2, X1 ⟂ X2: A1* = 0, A2* = 1, Λ_2^1* = 1, Λ_1^2* = 0 is a global minimum;
    # on M1 = 0, Λ_1^2 = 0 the objective is h = (1 - Λ1 M2)² + (1 - M2)².
    corr = t([[[1.0, 0.0], [0.0, 1.0]]])
    a = t([[[[0.0]], [[1.0]]]])
    b = t([[[[[0.0]], [[1.0]]], [[[0.0]], [[0.0]]]]])  # B_2^1 = 1, B_1^2 = 0
    assert cl.optimal_isolated(a, b, corr).flatten().tolist() == [0.0, 1.0]
    opt_lam = t([[[[[0.0]], [[1.0]]], [[[0.0]], [[0.0]]]]])
    assert cl.cordial_loss(t([[[[0.0]], [[1.0]]]]), opt_lam, a, b, corr).sum().item() == 0.0
    for m2, l1 in [(0.5, 2.0), (0.0, 0.0), (2.0, -1.0)]:
        lam = t([[[[[0.0]], [[l1]]], [[[0.0]], [[0.0]]]]])
        got = cl.cordial_loss(t([[[[0.0]], [[m2]]]]), lam, a, b, corr).sum().item()
        assert got == pytest.approx((1 - l1 * m2) ** 2 + (1 - m2) ** 2)


def test_the_paper_step_sizes_and_theorem_2() -> None:
    s = cl.StepSizes()
    assert s.eps(0) == pytest.approx(0.1)
    assert s.eta(0) == pytest.approx(0.05)
    assert s.eps(100) == pytest.approx(0.1 * 0.5 ** 0.6)
    assert s.eta(100) == pytest.approx(0.025)
    assert s.rho(0) == 1.0
    assert s.rho(2**20 - 1) == pytest.approx(2.0)
    assert all(s.theorem2_conditions().values())
    # η/ε → 0 like (t0/(t+t0))^0.4: the coordination layers are the slow time scale.
    assert s.eta(10**6) / s.eps(10**6) == pytest.approx(0.5 * (100 / (10**6 + 100)) ** 0.4)
    assert not cl.StepSizes(alpha=0.5).theorem2_conditions()["sum_eps2_rho2_finite"]
    assert not cl.StepSizes(beta=0.7).theorem2_conditions()["sum_eta2_over_eps_finite"]
    assert not cl.StepSizes(beta=1.2).theorem2_conditions()["sum_eta_diverges"]
    assert not cl.StepSizes(rho_exponent=0.0).theorem2_conditions()["rho_to_infinity"]


def test_leave_one_out_needs_two_samples() -> None:
    x = torch.zeros(1, 1, 2, 1, dtype=D64)
    with pytest.raises(ValueError, match="at least 2"):
        cl.local_variables(x[..., :1], x, x[..., :1], x)


def test_training_converges_on_a_small_problem() -> None:
    # Theorem 2 in miniature: the cordial loss falls far below the best isolated loss.
    gen = torch.Generator().manual_seed(9)
    p = small_problem(gen)
    n = 3
    m = torch.randn(1, n, 2, 2, generator=gen, dtype=D64) * 0.5
    lam = torch.randn(1, n, n, 2, 2, generator=gen, dtype=D64) * 0.5
    lam = lam * (1 - torch.eye(n, dtype=D64))[None, :, :, None, None]
    steps = cl.StepSizes()
    start = cl.cordial_loss(m, lam, p["a"], p["b"], p["corr"]).mean()
    for it in range(3000):
        x0, y0 = draw(p, 1, 10, gen)
        x1, _ = draw(p, 1, 10, gen)
        m, lam = cl.cordial_step(m, lam, x0, y0, x1, it, steps)
    end = cl.cordial_loss(m, lam, p["a"], p["b"], p["corr"]).mean()
    best_iso = cl.isolated_loss(p["a_star"], p["a"], p["b"], p["corr"]).mean()
    assert end < 0.05 * best_iso
    assert end < 0.01 * start
