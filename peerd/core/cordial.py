"""Cordial learning for the linear model (cordial-learning paper §3.1, §4, Algorithm 1).

Agent i sees X_i ∈ ℝ^d, predicts Y_i ∈ ℝ^m and owns an embedding M_i (m×d) and coordination
layers Λ_j^i (m×m) for every peer j. It receives only the embedded outputs M_j X_j of the
same sample ids and residualises them against its own input (the local variables
Z̃_j^i = X_j − R̃_j^i X_i, eq. 8), so that its expected gradient in M_i is 2(M_i − A_i*)
whatever the others do (Lemma 3). M_i moves on the fast time scale ε(t), Λ_j^i on the slow
one η(t) (Theorem 2: Σ η²/ε < ∞), and Λ is projected onto a Frobenius ball of radius ρ(t)
only inside the gradient of M_i.

Owns: the step-size sequences and their Theorem-2 conditions, the residualised local
variables, the stochastic gradients (10)/(12) and one two-time-scale step (for the whole
fleet, or for one agent from the embedded outputs its peers sent), the isolated SGD
baseline, the closed-form losses (4) and (14), the expected gradients (18)/(19) and the
Picard fixed point A_i* ← A_i + Σ_j Λ_j^i* A_j* Cov(X_j, X_i) of §6.1.

Every tensor carries a leading run axis r, so that many independent runs step together:
M [r, N, m, d]; Λ [r, N, N, m, m] with Λ[:, i, j] = Λ_j^i (the diagonal is ignored and kept
zero); inputs X [r, B, N, d]; labels Y [r, B, N, m]; B [r, N, N, m, d] with B[:, i, j] = B_j^i.
Cross-covariances are coordinate-wise, Cov(X_j, X_i) = C_ji·I_d, as in §6.1: C [r, N, N].

Pure: no data generation, no I/O; samples come in as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor


@dataclass(frozen=True, slots=True)
class StepSizes:
    """ε(t) = ε₀ (t₀/(t+t₀))^α, η(t) = η₀ (t₀/(t+t₀))^β, ρ(t) = (t+1)^γ (§6.1).

    Written with ε₀ = ε(0) and η₀ = η(0), so L_m = ε₀ t₀^α and L_λ = η₀ t₀^β. The paper's
    values are the defaults: α = 0.6, β = 1, t₀ = 100, ε(0) = 0.1, η(0) = 0.05, γ = 0.05.
    """

    eps0: float = 0.1
    eta0: float = 0.05
    alpha: float = 0.6
    beta: float = 1.0
    t0: float = 100.0
    rho_exponent: float = 0.05

    def eps(self, t: int) -> float:
        return float(self.eps0 * (self.t0 / (t + self.t0)) ** self.alpha)

    def eta(self, t: int) -> float:
        return float(self.eta0 * (self.t0 / (t + self.t0)) ** self.beta)

    def rho(self, t: int) -> float:
        return float((t + 1) ** self.rho_exponent)

    def theorem2_conditions(self) -> dict[str, bool]:
        """Theorem 2's conditions for these power laws, decided from the exponents.

        Σ t^-p diverges iff p ≤ 1; ε²ρ² ~ t^(2γ−2α) and η²/ε ~ t^(α−2β).
        """
        return {
            "sum_eps_diverges": 0.0 <= self.alpha <= 1.0,
            "sum_eta_diverges": 0.0 <= self.beta <= 1.0,
            "rho_to_infinity": self.rho_exponent > 0.0,
            "sum_eps2_rho2_finite": 2.0 * self.alpha - 2.0 * self.rho_exponent > 1.0,
            "sum_eta2_over_eps_finite": 2.0 * self.beta - self.alpha > 1.0,
        }


def _offdiag(n: int, like: Tensor) -> Tensor:
    return 1.0 - torch.eye(n, dtype=like.dtype, device=like.device)


def embedded(m: Tensor, x: Tensor) -> Tensor:
    """The embedded outputs M_j X_j that agents send: [r, B, N, m]."""
    return torch.einsum("rnad,rbnd->rbna", m, x)


def local_variables(e0: Tensor, x0: Tensor, e1: Tensor, x1: Tensor) -> tuple[Tensor, Tensor]:
    """The residualised received outputs M_j Z̃_{j,0}^{i,l} and M_j Z̃_{j,1}^{i,l} (eq. 8).

    ``e0``/``e1`` are the embedded outputs of batches B_t^0/B_t^1, ``x0``/``x1`` the inputs.
    Agent i only needs M_j R̃_j^i = (1/n) Σ_k (M_j X_j^k)(X_i^k)ᵀ, which it computes from what
    j sent and its own inputs. R̃_{j,0} leaves sample l out of B_t^0 (so it is independent of
    the sample it corrects); R̃_{j,1} comes from B_t^1. Returns two [r, B, N_i, N_j, m]
    tensors; their diagonal is M_i X_i (Z̃_i^i = X_i).
    """
    b = x0.shape[1]
    if b < 2:
        raise ValueError("the leave-one-out covariance needs a batch of at least 2")
    n = x0.shape[2]
    # S0[j, i] = Σ_k e0[k, j] x0[k, i]ᵀ over the whole batch; sample l is taken out below.
    s0 = torch.einsum("rkja,rkid->rjiad", e0, x0)
    sx = torch.einsum("rjiad,rlid->rlija", s0, x0)
    sq = (x0 * x0).sum(-1)  # ‖X_i^l‖²
    own = e0.unsqueeze(2)  # e0[l, j] broadcast over i
    loo = (sx - own * sq[..., None, None]) / (b - 1)
    mz0 = own - loo
    q = torch.einsum("rkja,rkid->rjiad", e1, x1) / x1.shape[1]
    mz1 = own - torch.einsum("rjiad,rlid->rlija", q, x0)
    eye = torch.eye(n, dtype=torch.bool, device=x0.device)[None, None, :, :, None]
    diag = own.expand_as(mz0)
    return torch.where(eye, diag, mz0), torch.where(eye, diag, mz1)


def project(lam: Tensor, radius: float) -> Tensor:
    """Π_t: each Λ_j^i onto the Frobenius ball of radius ρ(t)."""
    norm = torch.linalg.matrix_norm(lam)  # Frobenius over the last two axes
    scale = torch.clamp(radius / torch.clamp(norm, min=1e-300), max=1.0)
    return lam * scale[..., None, None]


def gradients(
    m: Tensor, lam: Tensor, x0: Tensor, y0: Tensor, x1: Tensor, radius: float
) -> tuple[Tensor, Tensor]:
    """The batch-averaged stochastic gradients g_{M_i} (eq. 10) and g_{Λ_j^i} (eq. 12): see
    :func:`embedded_gradients`, given the embedded outputs M_j X_j of both batches."""
    return embedded_gradients(embedded(m, x0), embedded(m, x1), lam, x0, y0, x1, radius)


def embedded_gradients(
    e0: Tensor, e1: Tensor, lam: Tensor, x0: Tensor, y0: Tensor, x1: Tensor, radius: float
) -> tuple[Tensor, Tensor]:
    """The batch-averaged stochastic gradients g_{M_i} (eq. 10) and g_{Λ_j^i} (eq. 12) from
    the embedded outputs ``e0``/``e1`` [r, B, N, m] of batches B_t^0/B_t^1.

    Agent i's rows read only everyone's embedded outputs and its own X_i, Y_i: what one agent
    holds when the others are remote (:func:`agent_step`).

    g_M uses the projected Λ (the projection bounds its variance, not its mean); g_Λ uses Λ
    itself, with the prediction residual from B_t^0's leave-one-out variables and the
    multiplier from the independent B_t^1 estimate, which is what makes it unbiased.

    Computed without materialising the [r, B, N, N, m] local variables of
    :func:`local_variables` (the tests check that both give the same gradients): with
    S[k, i] = Σ_l (M_k X_k^l)(X_i^l)ᵀ over B_t^0,

        Σ_k Λ_k^i M_k Z̃_{k,0}^{i,l} = T_i^l (1 + ‖X_i^l‖²/(B−1)) − P_i X_i^l/(B−1),
        T_i^l = Σ_k Λ_k^i M_k X_k^l,  P_i = Σ_k Λ_k^i S[k, i],

    and Σ_l r_i^l (M_j Z̃_{j,1}^{i,l})ᵀ = Σ_l r_i^l (M_j X_j^l)ᵀ − (Σ_l r_i^l X_i^lᵀ) Q[j, i]ᵀ
    with Q[j, i] = M_j R̃_{j,1}^i from B_t^1. Every term is a batched matrix product.
    """
    b = x0.shape[1]
    if b < 2:
        raise ValueError("the leave-one-out covariance needs a batch of at least 2")
    off = _offdiag(lam.shape[1], lam)[None, :, :, None, None]
    s0 = torch.einsum("rlka,rlid->rkiad", e0, x0)
    grow = 1.0 + (x0 * x0).sum(-1, keepdim=True) / (b - 1)  # [r, B, N, 1]

    def messages(lam_used: Tensor) -> Tensor:
        lam_used = lam_used * off
        t_msg = torch.einsum("rikab,rlkb->rlia", lam_used, e0)
        p_msg = torch.einsum("rikab,rkibd->riad", lam_used, s0)
        return t_msg * grow - torch.einsum("riad,rlid->rlia", p_msg, x0) / (b - 1)

    resid = e0 + messages(lam) - y0
    projected = project(lam, radius)
    # The ball is left only early on (ρ(t) grows, Λ settles): reuse the residual otherwise.
    resid_proj = resid if torch.equal(projected, lam) else e0 + messages(projected) - y0
    g_m = 2.0 / b * torch.einsum("rlia,rlid->riad", resid_proj, x0)
    q = torch.einsum("rkja,rkid->rjiad", e1, x1) / x1.shape[1]
    h = torch.einsum("rlia,rlid->riad", resid, x0)
    g_lam = torch.einsum("rlia,rljb->rijab", resid, e0) - torch.einsum("riad,rjibd->rijab", h, q)
    return g_m, 2.0 / b * g_lam * off


def cordial_step(
    m: Tensor, lam: Tensor, x0: Tensor, y0: Tensor, x1: Tensor, t: int, steps: StepSizes
) -> tuple[Tensor, Tensor]:
    """One iteration of Algorithm 1 for every agent: M_i with ε(t), Λ_j^i with η(t)."""
    g_m, g_lam = gradients(m, lam, x0, y0, x1, steps.rho(t))
    return m - steps.eps(t) * g_m, lam - steps.eta(t) * g_lam


def agent_step(
    m_i: Tensor, lam_i: Tensor, index: int, e0: Tensor, x0_i: Tensor, y0_i: Tensor,
    e1: Tensor, x1_i: Tensor, t: int, steps: StepSizes,
) -> tuple[Tensor, Tensor]:
    """:func:`cordial_step` for agent ``index`` alone, from what it holds: M_i [m, d],
    Λ^i [N, m, m] (Λ^i[j] = Λ_j^i), its inputs x_i [B, d] of both batches and labels
    y_i [B, m] of B_t^0, and the peers' embedded outputs e [B, N, m] (zero where absent;
    the own slot is recomputed as M_i x_i). Equal to row i of :func:`cordial_step` when the
    peers' outputs are M_j X_j: the other agents' inputs enter only through them.
    """
    n = e0.shape[1]

    def fleet(x: Tensor) -> Tensor:  # [B, k] -> [1, B, N, k], zero outside the own slot
        out = x.new_zeros(x.shape[0], n, x.shape[1])
        out[:, index] = x
        return out[None]

    def outputs(e: Tensor, x: Tensor) -> Tensor:
        e = e.clone()
        e[:, index] = x @ m_i.T
        return e[None]

    lam = lam_i.new_zeros(1, n, *lam_i.shape)
    lam[0, index] = lam_i
    g_m, g_lam = embedded_gradients(outputs(e0, x0_i), outputs(e1, x1_i), lam, fleet(x0_i),
                                    fleet(y0_i), fleet(x1_i), steps.rho(t))
    return m_i - steps.eps(t) * g_m[0, index], lam_i - steps.eta(t) * g_lam[0, index]


def isolated_step(m: Tensor, x0: Tensor, y0: Tensor, t: int, steps: StepSizes) -> Tensor:
    """SGD on the isolated loss (4) with the same ε(t) and batch B_t^0."""
    resid = embedded(m, x0) - y0
    g = 2.0 / x0.shape[1] * torch.einsum("rlia,rlid->riad", resid, x0)
    return m - steps.eps(t) * g


def _quadratic(w: Tensor, cov: Tensor) -> Tensor:
    """E‖Σ_j W_ij X_j‖² = Σ_jk C_jk tr(W_ij W_ikᵀ) for every agent i: [r, N]."""
    flat = w.flatten(3)  # [r, i, j, m·d]
    mixed = torch.matmul(cov.unsqueeze(1), flat)  # Σ_k C_jk W_ik
    return (flat * mixed).sum((2, 3))


def isolated_loss(m: Tensor, a: Tensor, b: Tensor, cov: Tensor) -> Tensor:
    """Loss (4), E‖Y_i − M_i X_i‖², in closed form (noiseless labels): [r, N]."""
    n = m.shape[1]
    eye = torch.eye(n, dtype=torch.bool, device=m.device)[None, :, :, None, None]
    w = torch.where(eye, (a - m).unsqueeze(2).expand_as(b), b)
    return _quadratic(w, cov)


def cordial_loss(m: Tensor, lam: Tensor, a: Tensor, b: Tensor, cov: Tensor) -> Tensor:
    """Loss (14), E‖Y_i − M_i Z_i^i − Σ_k Λ_k^i M_k Z_k^i‖² with the true Z_k^i: [r, N].

    Z_k^i = X_k − C_ki X_i, so the coefficient of X_k (k ≠ i) is B_k^i − Λ_k^i M_k and that of
    X_i is A_i − M_i + Σ_k Λ_k^i M_k C_ki.
    """
    n = m.shape[1]
    off = _offdiag(n, m)[None, :, :, None, None]
    lm = torch.einsum("rikab,rkbd->rikad", lam, m) * off  # Λ_k^i M_k
    w = b - lm
    own = a - m + torch.einsum("rikad,rki->riad", lm, cov)
    eye = torch.eye(n, dtype=torch.bool, device=m.device)[None, :, :, None, None]
    w = torch.where(eye, own.unsqueeze(2).expand_as(w), w)
    return _quadratic(w, cov)


def optimal_isolated(a: Tensor, b: Tensor, cov: Tensor) -> Tensor:
    """A_i* = A_i + Σ_{j≠i} B_j^i Cov(X_j, X_i) (Assumption 1): [r, N, m, d]."""
    off = _offdiag(a.shape[1], a)[None]
    return a + torch.einsum("rijad,rji->riad", b, cov * off.transpose(1, 2))


def expected_gradients(
    m: Tensor, lam: Tensor, a: Tensor, b: Tensor, cov: Tensor
) -> tuple[Tensor, Tensor]:
    """E g_{M_i} = 2(M_i − A_i*) (18) and E g_{Λ_j^i} = 2 Σ_k (Λ_k^i M_k − B_k^i) C_kj M_jᵀ (19).

    C_kj is Cov(Z_k^i, Z_j^i) = (C_kj − C_ki C_ji) I for coordinate-wise covariances.
    """
    n = m.shape[1]
    off = _offdiag(n, m)
    g_m = 2.0 * (m - optimal_isolated(a, b, cov))
    cov_t = cov.transpose(1, 2)  # [r, i, k] = C_ki
    zc = cov[:, None, :, :] - cov_t[:, :, :, None] * cov_t[:, :, None, :]
    lm = torch.einsum("rikab,rkbd->rikad", lam, m)
    err = (lm - b) * off[None, :, :, None, None]
    g_lam = 2.0 * torch.einsum("rikad,rikj,rjbd->rijab", err, zc, m)
    return g_m, g_lam * off[None, :, :, None, None]


def picard_fixed_point(
    a: Tensor, lam_star: Tensor, cov: Tensor, *, tol: float = 1e-13, max_iter: int = 10_000
) -> Tensor:
    """A_i* as the fixed point of A_i* ← A_i + Σ_{j≠i} Λ_j^i* A_j* Cov(X_j, X_i) (§6.1).

    A contraction when Σ_j ‖Λ_j^i*‖₂ ‖Cov(X_j, X_i)‖₂ ≤ κ < 1 for every i (the κ = 0.8
    scaling); raises if it has not converged after ``max_iter`` sweeps.
    """
    off = _offdiag(a.shape[1], a)[None]
    weights = cov.transpose(1, 2) * off  # [r, i, j] = C_ji
    star = a.clone()
    for _ in range(max_iter):
        new = a + torch.einsum("rijab,rjbd,rij->riad", lam_star, star, weights)
        if float((new - star).abs().max()) <= tol:
            return new
        star = new
    raise ValueError("Picard iteration did not converge: is the κ scaling applied?")


def coordination_scale(lam_star: Tensor, cov: Tensor, kappa: float = 0.8) -> Tensor:
    """s_i = min(1, κ/γ_i), γ_i = Σ_{j≠i} ‖Λ_j^i*‖₂ ‖Cov(X_j, X_i)‖₂: [r, N]."""
    off = _offdiag(lam_star.shape[1], lam_star)[None]
    spectral = torch.linalg.matrix_norm(lam_star, ord=2)  # [r, i, j]
    gamma = (spectral * cov.transpose(1, 2).abs() * off).sum(-1)
    return torch.clamp(kappa / torch.clamp(gamma, min=1e-300), max=1.0)
