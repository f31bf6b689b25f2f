"""FedBSS as a local policy: warm-up, then a loss-sorted, peak-split, cosine-gated curriculum.

Seed ``fedbss-fedcvt-lecture.txt`` §16.2–16.5, per local training of one agent:

1. **Score** every local sample with a read-only forward pass of the blended model (§16.2):
   softmax p, loss L = −ln p_true, spread s = p_max − p_min, uncertainty u = 1 − s.
2. **Sort** by loss, easy to hard (ties by sample index, §16.3.1).
3. **Split at the peak** (§16.3.2): j* = the rank of the highest u (the first, on ties);
   greens are ranks 1..j* (kept in every epoch), reds the ranks after it.
4. **Admit reds on a cosine schedule** (§16.4): in local epoch e = 1..E the epoch trains on the
   greens plus the n(e) = round(|R|·α(e)) easiest reds, α(e) = (1 − cos(πe/E))/2; |R|, not
   the whole album, is multiplied (the class's correction, §16.4.3). Inside an epoch the
   samples go easy to hard (§16.4.4), cut into consecutive batches.
5. **Warm-up** (§16.5): the first ``warmup_rounds`` rounds are plain training (no scoring,
   sorting or splitting), and the warm-up starts again when the local data grew by more than
   ``regrow_fraction`` since the warm-up last started (§16.5.3). A warm-up round is the
   plain path itself, so it is bit for bit plain training (tests/core/test_fedbss.py).

"round" is half-up (2.5 → 3), not Python's banker's rounding: the seed's spoken "round the
product" and a count that never depends on the parity of the integer part.

Pure like the rest of ``peerd.core``: tensors in, randomness as a generator; the per-agent
warm-up state is a value (:class:`WarmupState`) the caller keeps between rounds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from peerd.core.local_update import LocalResult, LossName, local_update


@dataclass(frozen=True, slots=True)
class FedBSS:
    """The FedBSS local policy: warm-up rounds, local epochs E, and the re-warm-up trigger."""

    warmup_rounds: int = 5
    epochs: int = 10  # E: the lecture's demo value
    #: Re-warm-up when the data size exceeds (1 + regrow_fraction) × its size at the last
    #: warm-up's start.
    regrow_fraction: float = 0.2
    #: SGD steps of one curriculum round, spread over the E epochs (:func:`curriculum_update`'s
    #: ``steps``); 0 = E full epochs. A budget bounds a round's time whatever the data size,
    #: and matches plain training's K steps when compared with it.
    step_budget: int = 0

    def __post_init__(self) -> None:
        if self.warmup_rounds < 0:
            raise ValueError(f"warmup_rounds must be >= 0, got {self.warmup_rounds}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if not (math.isfinite(self.regrow_fraction) and self.regrow_fraction >= 0):
            raise ValueError(f"regrow_fraction must be finite and >= 0, got "
                             f"{self.regrow_fraction}")
        if self.step_budget < 0:
            raise ValueError(f"step_budget must be >= 0, got {self.step_budget}")


@dataclass(frozen=True, slots=True)
class Scores:
    """Per sample: L = −ln p_true, s = p_max − p_min, u = 1 − s (each ``[N]``)."""

    loss: torch.Tensor
    spread: torch.Tensor
    uncertainty: torch.Tensor


def scores_from_probs(probs: torch.Tensor, target: torch.Tensor) -> Scores:
    """The three numbers of §16.2 from softmax rows ``[N, C]`` and true classes ``[N]``."""
    if probs.dim() != 2 or target.shape != (probs.shape[0],):
        raise ValueError(f"need probs [N, C] and target [N], got {tuple(probs.shape)} and "
                         f"{tuple(target.shape)}")
    p_true = probs.gather(1, target.long().unsqueeze(1)).squeeze(1)
    spread = probs.max(dim=1).values - probs.min(dim=1).values
    return Scores(-torch.log(p_true), spread, 1.0 - spread)


def score_samples(model: nn.Module, X: torch.Tensor, y: torch.Tensor, *,
                  batch_size: int = 1024) -> Scores:
    """The read-only scoring pass: no gradient, the weights untouched, train mode restored.

    Loss via log-softmax (exact for tiny p_true, where −ln(softmax) would give inf)."""
    was_training = model.training
    model.eval()
    losses, spreads = [], []
    try:
        with torch.no_grad():
            for start in range(0, X.shape[0], batch_size):
                out = model(X[start:start + batch_size])
                t = y[start:start + batch_size].long()
                logp = torch.log_softmax(out, dim=-1)
                losses.append(-logp.gather(1, t.unsqueeze(1)).squeeze(1))
                p = logp.exp()
                spreads.append(p.max(dim=1).values - p.min(dim=1).values)
    finally:
        model.train(was_training)
    spread = torch.cat(spreads)
    return Scores(torch.cat(losses), spread, 1.0 - spread)


@dataclass(frozen=True, slots=True)
class Split:
    """Sample indices sorted by loss (easy to hard); the first ``greens`` of them are green."""

    order: torch.Tensor
    greens: int

    @property
    def reds(self) -> int:
        return int(self.order.shape[0]) - self.greens


def peak_split(loss: torch.Tensor, uncertainty: torch.Tensor) -> Split:
    """Sort by loss (stable: ties by index), cut after the rank of the highest uncertainty."""
    if loss.dim() != 1 or loss.shape != uncertainty.shape or loss.shape[0] == 0:
        raise ValueError("need equal, non-empty 1-d loss and uncertainty")
    order = torch.sort(loss, stable=True).indices
    peak = int(torch.argmax(uncertainty[order]))  # the first maximum on ties
    return Split(order, peak + 1)


def alpha(epoch: int, epochs: int) -> float:
    """α(e) = (1 − cos(πe/E))/2 for e in 0..E: 0 at e = 0, 1/2 at E/2, 1 at E."""
    if not 0 <= epoch <= epochs or epochs < 1:
        raise ValueError(f"need 0 <= epoch <= epochs, epochs >= 1 (got {epoch}, {epochs})")
    return (1.0 - math.cos(math.pi * epoch / epochs)) / 2.0


def admitted_reds(reds: int, epoch: int, epochs: int) -> int:
    """n(e) = round(|R|·α(e)), half-up."""
    # Rounded to 9 places first: cos(π/2) is 6e-17, not 0, so 3·α(5 of 10) would be
    # 1.4999… and round down where the arithmetic says 1.5.
    return min(reds, math.floor(round(reds * alpha(epoch, epochs), 9) + 0.5))


def epoch_indices(split: Split, epoch: int, epochs: int) -> torch.Tensor:
    """Epoch e's samples, easy to hard: every green, then the easiest n(e) reds."""
    return split.order[:split.greens + admitted_reds(split.reds, epoch, epochs)]


def budget_per_epoch(admitted: list[int], steps: int) -> list[int]:
    """``steps`` SGD steps spread over the epochs in proportion to their admitted counts.

    Cumulative rounding (epoch e gets round(K·C_e/C_E) − round(K·C_{e−1}/C_E), C_e the
    admitted samples of epochs 1..e) sums to exactly K and keeps full epochs' shape: later
    epochs, which admit more reds, get more steps."""
    if steps < 0 or any(n < 0 for n in admitted):
        raise ValueError("steps and admitted counts must be >= 0")
    total = sum(admitted)
    if total == 0:
        return [0] * len(admitted)
    out, done, cum = [], 0, 0
    for n in admitted:
        cum += n
        upto = math.floor(steps * cum / total + 0.5)
        out.append(upto - done)
        done = upto
    return out


def budget_positions(pool: int, steps: int, batch_size: int,
                     generator: torch.Generator) -> list[torch.Tensor]:
    """``steps`` batches of positions into an epoch's admitted list (easy to hard).

    The epoch subsampled: ``steps × b`` positions (b = min(batch_size, pool)) drawn uniformly
    without replacement, whole passes first when the budget exceeds the pool, each pass in
    rank order, cut into consecutive batches, so an epoch still goes easy to hard."""
    if steps <= 0 or pool <= 0:
        return []
    b = min(batch_size, pool)
    passes, rest = divmod(steps * b, pool)
    seq = [torch.arange(pool)] * passes
    if rest:
        seq.append(torch.sort(torch.randperm(pool, generator=generator)[:rest]).values)
    flat = torch.cat(seq)
    return [flat[i * b:(i + 1) * b] for i in range(steps)]


@dataclass(frozen=True, slots=True)
class WarmupState:
    """One agent's warm-up progress: rounds of it done, data size when it last started."""

    done: int = 0
    base_size: int = 0


def next_round(policy: FedBSS, state: WarmupState, size: int) -> tuple[bool, WarmupState]:
    """Is this round curriculum (True) or warm-up (False), and the state after it.

    Growth past ``(1 + regrow_fraction) × base_size`` restarts the warm-up (§16.5.3)."""
    if size <= 0:
        raise ValueError("no local data")
    if state.base_size == 0 or size > state.base_size * (1.0 + policy.regrow_fraction):
        state = WarmupState(0, size)
    if state.done < policy.warmup_rounds:
        return False, WarmupState(state.done + 1, state.base_size)
    return True, state


def curriculum_update(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int,
    lr: float,
    rho: float,
    policy: FedBSS,
    generator: torch.Generator,
    anchor: Mapping[str, torch.Tensor] | None = None,
    steps: int = 0,
) -> LocalResult:
    """One curriculum local training in place: score, split, E epochs easy to hard.

    Classification only (the scores need a true class). The batches, in curriculum order,
    are the steps of one :func:`local_update` call (same step rule, proximal term included);
    x̄ is ``anchor`` or the model as passed in. ``steps`` > 0 is a step budget: exactly that
    many batches per round, spread over the E epochs (:func:`budget_per_epoch`) and drawn from
    each epoch's admitted samples (:func:`budget_positions`), so that FedBSS and plain training
    can be compared at the same number of SGD steps; 0 trains full epochs. Returns the steps
    taken and the loss over them."""
    if X.shape[0] != y.shape[0] or X.shape[0] == 0:
        raise ValueError(f"need matching, non-empty data ({X.shape[0]} vs {y.shape[0]})")
    if batch_size <= 0:
        raise ValueError(f"batch_size must be > 0, got {batch_size}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    s = score_samples(model, X, y)
    split = peak_split(s.loss, s.uncertainty)
    pools = [epoch_indices(split, e, policy.epochs) for e in range(1, policy.epochs + 1)]
    budget = budget_per_epoch([int(p.shape[0]) for p in pools], steps) if steps else None
    batches: list[torch.Tensor] = []
    for e, idx in enumerate(pools):
        if budget is None:
            cut = [idx[i:i + batch_size] for i in range(0, idx.shape[0], batch_size)]
        else:
            cut = [idx[pos] for pos in
                   budget_positions(int(idx.shape[0]), budget[e], batch_size, generator)]
        # Each batch's rows shuffled: no effect on the step but its rounding, and kept for
        # that: it is the draw the sampler made when every batch was a one-step local_update
        # call of its own, so earlier runs and pinned results reproduce bit for bit.
        batches += [b[torch.randperm(b.shape[0], generator=generator)] for b in cut]
    if not batches:
        return LocalResult(0, float("nan"), float("nan"))
    step_losses: list[torch.Tensor] = []

    def task_loss(out: torch.Tensor, target: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
        # f itself, recorded per step: the mean below is over Python floats (float64), as
        # it always was, not local_update's float32 mean.
        value = nn.functional.cross_entropy(out, target)
        step_losses.append(value.detach())
        return value

    local_update(model, X, y, steps=len(batches), batch_size=batch_size, lr=lr, rho=rho,
                 loss="cross_entropy", generator=generator, anchor=anchor, objective=task_loss,
                 batches=batches)
    losses = [float(v) for v in step_losses]
    return LocalResult(len(losses), sum(losses) / len(losses), losses[-1])


def fedbss_local_update(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    state: WarmupState,
    policy: FedBSS,
    steps: int,
    batch_size: int,
    lr: float,
    rho: float,
    loss: LossName,
    generator: torch.Generator,
    anchor: Mapping[str, torch.Tensor] | None = None,
) -> tuple[LocalResult, WarmupState, bool]:
    """One agent's FedBSS local training: a warm-up round is exactly the plain
    :func:`local_update` (``steps`` proximal steps, same arguments, same generator draws); a
    curriculum round is :func:`curriculum_update`. Returns the result, the warm-up state to keep
    for the next round, and whether this round was curriculum."""
    if loss != "cross_entropy":
        raise ValueError(f"FedBSS scores samples by their true class: needs cross_entropy, "
                         f"not {loss}")
    curriculum, state = next_round(policy, state, int(X.shape[0]))
    if not curriculum:
        result = local_update(model, X, y, steps=steps, batch_size=batch_size, lr=lr, rho=rho,
                              loss=loss, generator=generator, anchor=anchor)
        return result, state, False
    result = curriculum_update(model, X, y, batch_size=batch_size, lr=lr, rho=rho,
                               policy=policy, generator=generator, anchor=anchor,
                               steps=policy.step_budget)
    return result, state, True
