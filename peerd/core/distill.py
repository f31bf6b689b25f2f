"""Distillation as a local-train policy: CE + β·KL towards the knowledge cache's teachers.

FedCache's device objective (seed ``fedcache-notes-zh.txt``, eq. 18), per local sample i with
teacher logits z̄_i (the mean of its R neighbours' logits, eq. 17):

    J = (1/B) Σ_i [ CE(f(x_i), y_i) + β · 1[i has a teacher] · T² · KL(τ(z̄_i) ‖ τ(f(x_i))) ]

with τ(z) = softmax(z / T). **Direction.** Eq. 18 writes KL(τ(f(x)) ‖ τ(z̄)), but the
paper's own code (``utils.KL_Loss``, ``nn.KLDivLoss(log_softmax(student/T), softmax(teacher/
T))``) computes KL(teacher ‖ student), the usual distillation direction (the student covers
the teacher's mass); we follow the code. **Temperature.** T = 3 and the T² factor (which keeps
the gradient's scale independent of T, Hinton et al.) are that code's; the paper names only
β = 1.5 and R = 16. (The code also divides the teacher by T once more before the loss and
adds 1e-7 to its probabilities; we do neither: log-softmax is exact.) A row without a teacher
(the cache found no neighbour) contributes its CE only, and the mean is over the whole batch,
so such rows weigh as much as in plain training.

With β = 0 the objective *is* the cross-entropy: the KL term is skipped, not multiplied by
zero, so training is bit for bit plain SGD (tests/core/test_distill.py).

Pure like the rest of ``peerd.core``: teacher logits come in as tensors (the node's
:mod:`peerd.learn.knowcache` computes them), randomness as a generator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from peerd.core.local_update import LocalResult, Objective, local_update


@dataclass(frozen=True, slots=True)
class Distillation:
    """The local policy of knowledge mode: how strongly and how softly to distil."""

    beta: float = 1.5  # the paper's β
    temperature: float = 3.0  # the paper code's T
    r: int = 16  # neighbours averaged per sample (the paper's R)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.beta) and self.beta >= 0):
            raise ValueError(f"beta must be finite and >= 0, got {self.beta}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be finite and > 0, got {self.temperature}")
        if self.r < 1:
            raise ValueError(f"r must be >= 1, got {self.r}")


def kl_rows(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per row, T² · KL(softmax(teacher/T) ‖ softmax(student/T)): ``[B]``."""
    log_s = torch.log_softmax(student / temperature, dim=-1)
    log_t = torch.log_softmax(teacher / temperature, dim=-1)
    kl = (log_t.exp() * (log_t - log_s)).sum(dim=-1)
    return kl * (temperature * temperature)


def distill_loss(
    student: torch.Tensor,
    target: torch.Tensor,
    teacher: torch.Tensor,
    has_teacher: torch.Tensor,
    policy: Distillation,
) -> torch.Tensor:
    """The batch's J: mean CE plus β times the batch-mean KL over the rows with a teacher."""
    ce = nn.functional.cross_entropy(student, target)
    if policy.beta == 0:
        return ce  # skipped, not multiplied: bit-identical to plain training
    kl = kl_rows(student, teacher, policy.temperature) * has_teacher.to(student.dtype)
    return ce + policy.beta * kl.sum() / student.shape[0]


def _check_teachers(n: int, num_classes: int | None, teacher: torch.Tensor,
                    counts: torch.Tensor) -> None:
    if teacher.dim() != 2 or teacher.shape[0] != n:
        raise ValueError(f"teacher logits must be [{n}, C], got {tuple(teacher.shape)}")
    if num_classes is not None and teacher.shape[1] != num_classes:
        raise ValueError(f"teacher has {teacher.shape[1]} classes, the model {num_classes}")
    if counts.shape != (n,):
        raise ValueError(f"neighbour counts must be [{n}], got {tuple(counts.shape)}")
    if not torch.isfinite(teacher).all():
        raise ValueError("teacher logits contain NaN or infinity")


def distill_objective(teacher: torch.Tensor, counts: torch.Tensor,
                      policy: Distillation) -> Objective:
    """The objective :func:`peerd.core.local_update.local_update` trains on, for a dataset
    whose row i has teacher logits ``teacher[i]`` found from ``counts[i]`` neighbours."""
    has = counts > 0

    def objective(out: torch.Tensor, target: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return distill_loss(out, target, teacher[idx], has[idx], policy)

    return objective


def distill_local_update(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    teacher: torch.Tensor,
    counts: torch.Tensor,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    policy: Distillation,
    generator: torch.Generator,
) -> LocalResult:
    """``steps`` SGD steps on J in place (the daemon's path; no proximal term: in knowledge
    mode nothing is blended, so there is no x̄ to hold)."""
    _check_teachers(X.shape[0], None, teacher, counts)
    return local_update(model, X, y, steps=steps, batch_size=batch_size, lr=lr, rho=0.0,
                        loss="cross_entropy", generator=generator,
                        objective=distill_objective(teacher, counts, policy))


def batched_distill_update(
    model: nn.Module,
    params: Mapping[str, torch.Tensor],
    X_batches: torch.Tensor,
    y_batches: torch.Tensor,
    teacher_batches: torch.Tensor,
    has_batches: torch.Tensor,
    *,
    lr: float,
    policy: Distillation,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """J for A stacked models of one architecture at once (the simulator).

    Shapes as :func:`peerd.core.local_update.batched_local_update`, plus ``teacher_batches``
    ``[K, A, B, C]`` and ``has_batches`` ``[K, A, B]`` (bool). Returns the new parameters and
    the mean of J per agent ``[A]``. With β = 0 the arithmetic is that function's at ρ = 0.
    """
    if lr <= 0:
        raise ValueError(f"need lr > 0, got {lr}")

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, t: torch.Tensor,
             z: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return distill_loss(functional_call(model, p, (x,)), t, z, h, policy)

    step_grad = vmap(grad_and_value(loss))
    current = {n: t.detach() for n, t in params.items()}
    steps = X_batches.shape[0]
    agents = next(iter(current.values())).shape[0]
    total = torch.zeros(agents)
    for k in range(steps):
        grads, values = step_grad(current, X_batches[k], y_batches[k], teacher_batches[k],
                                  has_batches[k])
        current = {n: p - lr * grads[n] for n, p in current.items()}
        total += values.detach()
    mean = total / steps if steps else torch.full((agents,), float("nan"))
    return current, mean
