"""FedCVT's two pure pieces: the attention fill of a missing view and the pseudo-label gate.

Seed ``fedbss-fedcvt-lecture.txt`` §16.6 (FedCVT, Kang et al., "FedCVT: Semi-supervised
Vertical Federated Learning with Cross-view Training", 2022). Two parties hold different
feature blocks of the same people; for a person only one party has ("unaligned"), the other
party's representation is missing.

- **Attention fill** (§16.6.2): the missing representation is a convex mix of the *aligned*
  people's representations, weighted by how well this person's query matches each aligned
  person's key: ``softmax(Q Kᵀ / √d_k) V``. The lecture did not speak the ``1/√d_k`` factor
  but quotes it from the write-up; we use it (the paper's form). The optional ``sharpen``
  temperature T (weights ``w^(1/T)`` renormalised) is the paper's code's
  (``fedcvt_repr_estimator.py``, T = 0.1 there), not the lecture's; ``None`` (the default
  here and in ``peerd sim fedcvt``) turns it off: T = 0.1 raises the weights to the 10th
  power and so undoes the softness the seed's 1/√d_k scale is there for.
  The softmax subtracts each row's maximum before exponentiating (numerically stable), and
  sharpening works in the log domain for the same reason.
- **Pseudo-label gate** (§16.6.3): a sample without a true label gets one only when the three
  classifiers (view A only, view B only, both views) all pick the same class *and* each one's
  probability for it is above the threshold (> 0.5, strictly: "above a threshold greater than
  50 %"). The lecture's cartoons are the tests: cat 80/70/90 → cat; cat 80, cat 70, dog 90 →
  reject; all cat at 40 → reject. The paper's code (``select_reprs_for_multiclass``) checks
  the same thing with ``>`` against 0.5.
- **Cross-view loss** (§16.6.4): the sum of the three classifiers' cross-entropies on the
  samples that have a (true or gated pseudo) label. The paper adds similarity and difference
  regularisers over shared/unique representation halves; this project's simulator uses one
  representation per party and leaves them out (said again in :mod:`peerd.sim.fedcvt`).

Pure like the rest of ``peerd.core``: tensors in, tensors out; no randomness at all. Owns no
models and no training loop (that is :mod:`peerd.sim.fedcvt`'s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F  # noqa: N812  (the torch convention)


def attention_weights(query: torch.Tensor, keys: torch.Tensor, *,
                      sharpen: float | None = None) -> torch.Tensor:
    """Rows of ``softmax(Q Kᵀ / √d_k)`` (``[M, N]``, each row non-negative, summing to 1).

    ``query`` is ``[M, d_k]`` (the incomplete people), ``keys`` ``[N, d_k]`` (the aligned
    people, N ≥ 1). ``sharpen`` = T in (0, ∞) raises the weights to 1/T and renormalises
    (the paper's code); T = 1 is the plain softmax.
    """
    if query.dim() != 2 or keys.dim() != 2:
        raise ValueError(f"attention needs query [M, d_k] and keys [N, d_k], got "
                         f"{tuple(query.shape)} and {tuple(keys.shape)}")
    if query.shape[1] != keys.shape[1]:
        raise ValueError(f"query and keys differ in d_k: {query.shape[1]} != {keys.shape[1]}")
    if keys.shape[0] == 0:
        raise ValueError("attention needs at least one aligned row (keys is empty)")
    if query.shape[1] == 0:
        raise ValueError("attention needs d_k >= 1")
    if sharpen is not None and not (math.isfinite(sharpen) and sharpen > 0):
        raise ValueError(f"sharpen must be a finite temperature > 0, got {sharpen}")
    scores = query @ keys.T / math.sqrt(query.shape[1])
    if sharpen is not None:
        # softmax(s)^(1/T) renormalised == softmax(s / T): the same weights without the
        # underflow of raising small probabilities to a large power.
        scores = scores / sharpen
    # Subtract the row maximum: exp() of the largest score is exp(0) = 1, so nothing
    # overflows however large the dot products get.
    scores = scores - scores.max(dim=1, keepdim=True).values
    weights = scores.exp()
    return weights / weights.sum(dim=1, keepdim=True)


def attention_fill(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, *,
                   sharpen: float | None = None) -> torch.Tensor:
    """The filled representations ``softmax(Q Kᵀ / √d_k) V`` (``[M, d_v]``).

    ``keys`` and ``values`` describe the same N aligned people, row for row: ``values`` is
    ``[N, d_v]``, the other party's representations of them.
    """
    if values.dim() != 2 or values.shape[0] != keys.shape[0]:
        raise ValueError(f"values must be [N, d_v] with the keys' N = {keys.shape[0]} rows, "
                         f"got {tuple(values.shape)}")
    return attention_weights(query, keys, sharpen=sharpen) @ values


@dataclass(frozen=True, slots=True)
class Gate:
    """The gate's verdict per sample: ``accepted`` ``[M]`` bool and ``labels`` ``[M]`` int64
    (the agreed class; meaningful only where accepted)."""

    accepted: torch.Tensor
    labels: torch.Tensor


def pseudo_label_gate(probs_a: torch.Tensor, probs_b: torch.Tensor, probs_ab: torch.Tensor,
                      *, threshold: float = 0.5) -> Gate:
    """Accept a pseudo label where all three classifiers agree and each is > ``threshold``.

    Each ``probs_*`` is ``[M, C]`` probability rows (softmax outputs) of classifier A (view A),
    B (view B) and AB (both views) for the same M samples.
    """
    if not (0.0 <= threshold < 1.0):
        raise ValueError(f"threshold must be in [0, 1), got {threshold}")
    shape = probs_a.shape
    if probs_a.dim() != 2 or probs_b.shape != shape or probs_ab.shape != shape:
        raise ValueError(f"the three classifiers' probabilities must all be [M, C], got "
                         f"{tuple(probs_a.shape)}, {tuple(probs_b.shape)}, "
                         f"{tuple(probs_ab.shape)}")
    conf_a, cls_a = probs_a.max(dim=1)
    conf_b, cls_b = probs_b.max(dim=1)
    conf_ab, cls_ab = probs_ab.max(dim=1)
    agree = (cls_a == cls_b) & (cls_b == cls_ab)
    confident = (conf_a > threshold) & (conf_b > threshold) & (conf_ab > threshold)
    return Gate(accepted=agree & confident, labels=cls_ab.long())


def cross_view_loss(logits: tuple[torch.Tensor, ...], target: torch.Tensor) -> torch.Tensor:
    """Σ over the given classifiers of the mean cross-entropy on ``target`` (§16.6.4).

    ``logits`` is the classifiers that can see these samples (A, B and AB on aligned rows;
    fewer where a view is only estimated). An empty batch contributes 0 (no NaN from a mean
    over nothing), so a batch where the gate accepted nobody adds nothing.
    """
    if not logits:
        raise ValueError("cross_view_loss needs at least one classifier's logits")
    if target.numel() == 0:
        return logits[0].sum() * 0.0
    return torch.stack([F.cross_entropy(lg, target) for lg in logits]).sum()
