"""Robust blend rules: what a node does instead of Σ α_j x_j when some peers may be bad.

Aggregation as pure functions (Flower's strategies, without a server), over the same stack the
weighted blend reads (own model first, row 0):

* :class:`Median`: the coordinate-wise median (the mean of the two middle values for an even
  count), unweighted like Flower's FedMedian: α says how much a member counts, which is what
  an attacker would inflate;
* :class:`Trimmed`: the coordinate-wise trimmed mean, ``floor(β·n)`` values cut on each side
  (β = 0.1 by default, β < 0.5), unweighted for the same reason;
* :class:`Clipped`: self-centred clipping (ClippedGossip): x_own + Σ α_j clip(x_j − x_own, τ),
  clip scaling a difference down to norm τ (τ = 1.0 by default); updates within τ are blended
  exactly as the weighted blend would;
* :class:`Krum`: Multi-Krum. Score_i = the sum of the n − f − 2 smallest squared distances from
  x_i to the others; the n − f best-scored models are blended with their α renormalised. It
  refuses n ≤ 2f + 2 (:class:`RobustError`) where Flower silently clamps f: a node holding too
  few models for the f it was told to survive should say so, not quietly tolerate fewer.

Clipping and Krum only change the weights (clip scale s_j: w_j = α_j s_j, the own model takes
the rest; Krum: α over the selected rows), so after a float64 statistics pass they are the
weighted blend's one matrix product. Median and trimmed mean are per coordinate, so they run
block by block. :func:`robust_blend_rows` is the whole-stack form (simulator, tests),
:func:`robust_blend_into` the daemon's: in place, column block by block, its float64
statistics accumulated block by block, so no stacked copy of the models exists.

It never chooses members or α (:mod:`peerd.core.plan`) and writes nothing but its output.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

import torch

from peerd.core.blend import BLEND_BLOCK, blend_into, blend_rows, block_schema
from peerd.core.blendrules import (
    RULE_NAMES,
    Clipped,
    Krum,
    Median,
    RobustError,
    RobustRule,
    Trimmed,
    parse_rule,
)
from peerd.core.entry import Schema

__all__ = ["RULE_NAMES", "Clipped", "Krum", "Median", "RobustError", "RobustRule", "Trimmed",
           "clip_weights", "coordinate_rule", "krum_select", "krum_weights", "own_distances",
           "parse_rule", "robust_blend_into", "robust_blend_rows"]

# --- weights from float64 statistics ---------------------------------------------------------


def clip_weights(alpha: Sequence[float], dist: Sequence[float], tau: float) -> list[float]:
    """ClippedGossip as blend weights: ``dist[j]`` = ‖x_j − x_own‖ (row 0 is the own model).

    x_own + Σ α_j s_j (x_j − x_own) with s_j = min(1, τ/‖x_j − x_own‖) is the weighted blend
    with w_j = α_j s_j (j ≥ 1) and w_0 = 1 − Σ_{j≥1} w_j."""
    if len(alpha) != len(dist):
        raise ValueError(f"{len(alpha)} weights for {len(dist)} distances")
    w = [0.0] + [a * min(1.0, tau / d) if d > 0 else a
                 for a, d in zip(alpha[1:], dist[1:], strict=True)]
    w[0] = max(0.0, 1.0 - math.fsum(w[1:]))
    return w


def _scaled_weights(w: Sequence[float], scale: Sequence[float]) -> list[float]:
    out = [0.0] + [a * s for a, s in zip(w[1:], scale[1:], strict=True)]
    out[0] = max(0.0, 1.0 - math.fsum(out[1:]))
    return out


def krum_select(sq_dist: torch.Tensor, f: int) -> list[int]:
    """Multi-Krum's selection from the ``[n, n]`` float64 squared distances: the n − f rows
    with the lowest scores (ties: the lower index), in row order."""
    n = sq_dist.shape[0]
    if n <= 2 * f + 2:
        raise RobustError(f"krum:{f} needs more than 2f + 2 = {2 * f + 2} models, got {n}")
    k = n - f - 2  # neighbours per score
    scores = []
    for i in range(n):
        others = torch.cat([sq_dist[i, :i], sq_dist[i, i + 1:]])
        scores.append(float(torch.sort(others).values[:k].sum()))
    order = sorted(range(n), key=lambda i: (scores[i], i))
    return sorted(order[: n - f])


def krum_weights(alpha: Sequence[float], sq_dist: torch.Tensor, f: int) -> list[float]:
    """α over Krum's selection, renormalised (uniform if the selection's α sums to 0)."""
    chosen = krum_select(sq_dist, f)
    total = math.fsum(alpha[i] for i in chosen)
    return [(alpha[i] / total if total > 0 else 1.0 / len(chosen)) if i in chosen else 0.0
            for i in range(len(alpha))]


# --- coordinate rules ------------------------------------------------------------------------


def coordinate_rule(block: torch.Tensor, rule: Median | Trimmed) -> torch.Tensor:
    """The rule down the rows of ``[n, b]``, as ``[b]`` (same dtype)."""
    n = block.shape[0]
    if isinstance(rule, Median) and n % 2:
        # Odd n: the middle value is torch's median (a selection, about half a sort's time).
        return torch.median(block, dim=0).values
    ordered = torch.sort(block, dim=0).values
    if isinstance(rule, Median):
        return (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    cut = math.floor(rule.beta * n)
    return ordered[cut: n - cut].mean(dim=0)


# --- whole stack and in place ----------------------------------------------------------------


def _sq_dists64(rows: torch.Tensor) -> torch.Tensor:
    """Pairwise squared distances of a block's rows, in float64, through the Gram matrix of
    the rows centred on row 0 (centring keeps the cancellation in ‖a‖² + ‖b‖² − 2a·b at the
    scale of the differences, not of the weights)."""
    c = rows.to(torch.float64)
    c -= c[0].clone()
    gram = c @ c.t()
    sq = gram.diagonal()
    return (sq.unsqueeze(0) + sq.unsqueeze(1) - 2 * gram).clamp_(min=0.0)


def _own_dists64(rows: torch.Tensor) -> torch.Tensor:
    c = rows.to(torch.float64)
    c -= c[0].clone()
    return torch.einsum("ij,ij->i", c, c)


def _alpha_list(alpha: torch.Tensor | Sequence[float], n: int) -> list[float]:
    a = [float(x) for x in (alpha.tolist() if isinstance(alpha, torch.Tensor) else alpha)]
    if len(a) != n:
        raise ValueError(f"{len(a)} weights for {n} models")
    return a


def robust_blend_rows(stack: torch.Tensor, alpha: torch.Tensor | Sequence[float],
                      rule: RobustRule, *, block: int = BLEND_BLOCK) -> torch.Tensor:
    """The rule over ``stack`` ``[n, D]`` (own model row 0) → ``[D]``."""
    if stack.dim() != 2 or stack.shape[0] == 0:
        raise ValueError(f"stack must be [n, D] with n >= 1, got {list(stack.shape)}")
    n, d = stack.shape
    a = _alpha_list(alpha, n)
    if isinstance(rule, Median | Trimmed):
        out = torch.empty(d, dtype=stack.dtype)
        for lo in range(0, d, block):
            # A contiguous copy of the column block: sorting a strided view is slower.
            out[lo: lo + block] = coordinate_rule(stack[:, lo: lo + block].contiguous(), rule)
        return out
    if isinstance(rule, Clipped):
        sq = torch.zeros(n, dtype=torch.float64)
        for lo in range(0, d, block):
            sq += _own_dists64(stack[:, lo: lo + block])
        return blend_rows(stack, clip_weights(a, sq.sqrt().tolist(), rule.tau))
    sqd = torch.zeros(n, n, dtype=torch.float64)
    for lo in range(0, d, block):
        sqd += _sq_dists64(stack[:, lo: lo + block])
    return blend_rows(stack, krum_weights(a, sqd, rule.f))


def _blocks(models: Sequence[Mapping[str, torch.Tensor]], schema: Schema, width: int,
            scale: Sequence[float] | None = None) -> Iterator[tuple[str, int, torch.Tensor]]:
    """(tensor name, offset, gathered ``[n, b]`` block) over every float tensor, in order.

    ``scale``: row j is gathered as x_0 + s_j (x_j − x_0) (update-norm clipping,
    :mod:`peerd.core.updatenorm`), so a rule sees clipped rows without a clipped copy."""
    gather = torch.empty(len(models), width, dtype=torch.float32)
    scaled = [(j, s) for j, s in enumerate(scale or ()) if j > 0 and s != 1.0]
    for spec in schema.float_specs:
        sources = [m[spec.name].detach().reshape(-1) for m in models]
        for lo in range(0, spec.numel, width):
            hi = min(lo + width, spec.numel)
            g = gather[:, : hi - lo]
            for row, src in enumerate(sources):
                g[row].copy_(src[lo:hi])
            for j, s in scaled:
                g[j].sub_(g[0]).mul_(s).add_(g[0])
            yield spec.name, lo, g


def _check_models(dest: Mapping[str, torch.Tensor],
                  models: Sequence[Mapping[str, torch.Tensor]], block: int) -> Schema:
    if not models:
        raise ValueError("nothing to blend")
    return block_schema(dest, models, block)


def own_distances(models: Sequence[Mapping[str, torch.Tensor]], *,
                  block: int = BLEND_BLOCK) -> list[float]:
    """‖x_j − x_0‖ for every model (row 0: the own model, distance 0), float64, block by
    block: the update norms :mod:`peerd.core.updatenorm` judges."""
    schema = _check_models(models[0] if models else {}, models, block)
    width = min(block, max((s.numel for s in schema.float_specs), default=1))
    sq = torch.zeros(len(models), dtype=torch.float64)
    with torch.no_grad():
        for _, _, g in _blocks(models, schema, width):
            sq += _own_dists64(g)
    return [float(x) for x in sq.sqrt()]


def robust_blend_into(dest: Mapping[str, torch.Tensor],
                      models: Sequence[Mapping[str, torch.Tensor]],
                      alpha: torch.Tensor | Sequence[float], rule: RobustRule, *,
                      block: int = BLEND_BLOCK,
                      scale: Sequence[float] | None = None) -> list[float] | None:
    """Write the rule over ``models`` (own first) into ``dest``'s float tensors, in place.

    ``dest`` may be ``models[0]``. ``scale``: the rule runs over x_0 + s_j (x_j − x_0)
    instead of x_j (update-norm clipping). Returns the weights used (clipped, Krum: what each
    model counted for) or None (median, trimmed: no weights)."""
    schema = _check_models(dest, models, block)
    n = len(models)
    if scale is not None and len(scale) != n:
        raise ValueError(f"{len(scale)} scales for {n} models")
    a = _alpha_list(alpha, n)
    width = min(block, max((s.numel for s in schema.float_specs), default=1))
    with torch.no_grad():
        if isinstance(rule, Median | Trimmed):
            for name, lo, g in _blocks(models, schema, width, scale):
                target = dest[name].detach()
                # Gathered before written, so dest may be one of the models.
                flat = target.view(-1) if target.is_contiguous() else target.reshape(-1)
                flat[lo: lo + g.shape[1]] = coordinate_rule(g, rule).to(target.dtype)
                if not target.is_contiguous():
                    target.copy_(flat.view(target.shape))
            return None
        if isinstance(rule, Clipped):
            sq = torch.zeros(n, dtype=torch.float64)
            for _, _, g in _blocks(models, schema, width, scale):
                sq += _own_dists64(g)
            w = clip_weights(a, sq.sqrt().tolist(), rule.tau)
        else:
            sqd = torch.zeros(n, n, dtype=torch.float64)
            for _, _, g in _blocks(models, schema, width, scale):
                sqd += _sq_dists64(g)
            w = krum_weights(a, sqd, rule.f)
        # The scaled rows as weights: Σ w_j (x_0 + s_j (x_j − x_0)) is the weighted blend with
        # w_j s_j, the own model taking the rest (exact algebra, no clipped copy).
        final = w if scale is None else _scaled_weights(w, scale)
        blend_into(dest, models, final, block=block)
        return final
