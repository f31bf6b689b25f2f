"""Local update (lecture §3.7–3.8): K mini-batch steps on f(x; ξ) + ρ/2‖x − x̄‖².

The gradient of the proximal term is ρ(x − x̄), so one step is

    x ← x − η (∇f(x; ξ) + ρ (x − x̄))

and with ρ = 0 this *is* plain SGD, bit for bit: the penalty is skipped, not multiplied by 0.

Two entry points share the step rule and the batch sampler:

* :func:`local_update` trains one ``nn.Module`` in place (the daemon). Each parameter is
  stepped inside backward as soon as its gradient is complete (plain SGD arithmetic, plus
  ρ(x − x̄) added into the gradient), so gradients never take a whole model's memory.
* :func:`batched_local_update` trains A stacked copies of one architecture at once with
  ``torch.func.vmap`` (the simulator: all agents of a round in one call). Its step
  (:func:`stacked_step_`) runs in place over the whole parameter list: two passes over the
  stacked parameters a step, no temporaries (the elementwise step was half a batched round's
  time when it built five fresh tensors of every stacked parameter).

Randomness comes in as a ``torch.Generator`` (the global RNG is never used); nothing here
reads a clock, loads data or builds a model: ``peerd.learn`` and the simulator do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

LossName = Literal["cross_entropy", "mse"]
#: A replacement task loss: (outputs, targets, batch row indices) -> scalar.
Objective = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _criterion(loss: LossName) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if loss == "cross_entropy":
        return nn.functional.cross_entropy
    if loss == "mse":

        def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            # A regression head of width 1 predicts [B, 1]; targets are [B].
            if out.dim() == target.dim() + 1 and out.shape[-1] == 1:
                out = out.squeeze(-1)
            return nn.functional.mse_loss(out, target)

        return mse
    raise ValueError(f"unknown loss {loss!r} (expected cross_entropy or mse)")


def sample_batches(n: int, batch_size: int, steps: int, generator: torch.Generator) -> torch.Tensor:
    """Indices ``[steps, b]`` into a dataset of ``n`` rows, ``b = min(batch_size, n)``.

    Consecutive random permutations are cut into batches, so every row is seen once per pass
    before any repeats. ``n`` is the data size *now*: rows that arrived since the last round
    are eligible immediately.
    """
    if n <= 0:
        raise ValueError("no local data to train on")
    if batch_size <= 0 or steps < 0:
        raise ValueError(f"batch_size must be > 0 and steps >= 0 (got {batch_size}, {steps})")
    b = min(batch_size, n)
    need = steps * b
    perms = [torch.randperm(n, generator=generator) for _ in range(-(-need // n))]
    flat = torch.cat(perms) if perms else torch.empty(0, dtype=torch.long)
    return flat[:need].reshape(steps, b)


@dataclass(frozen=True, slots=True)
class LocalResult:
    steps: int
    mean_loss: float  # task loss f only (without the penalty), averaged over the K steps
    last_loss: float


def local_update(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    rho: float,
    loss: LossName,
    generator: torch.Generator,
    anchor: Mapping[str, torch.Tensor] | None = None,
    objective: Objective | None = None,
    batches: Sequence[torch.Tensor] | None = None,
) -> LocalResult:
    """Train ``model`` in place for ``steps`` proximal SGD steps on ``(X, y)``.

    ``anchor`` is x̄, the model the round started from (default: a copy of the model as
    passed in; a caller that holds x̄ anyway, e.g. the published entry, saves that copy).
    ``objective`` replaces the task loss f (e.g. :mod:`peerd.core.distill`'s CE + β·KL); it
    gets the batch's outputs, targets and row indices into ``X``; the losses reported are its.
    ``batches`` replaces the sampler with the caller's own order (e.g. a curriculum's, easy to
    hard): step k trains on rows ``batches[k]`` of ``X``; it needs ``steps`` entries, and
    then ``batch_size`` is unused and nothing is drawn from ``generator``.
    """
    if rho < 0 or lr <= 0:
        raise ValueError(f"need rho >= 0 and lr > 0 (got rho={rho}, lr={lr})")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"{X.shape[0]} inputs but {y.shape[0]} targets")
    if batches is not None and len(batches) != steps:
        raise ValueError(f"{len(batches)} batches for {steps} steps")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params: list[torch.Tensor] = [p for _, p in named]
    # x̄ for each parameter, fetched when its step runs rather than all up front: a mapping
    # backed by a file (peerd.store.spool.PagedParams) then keeps one tensor of x̄ resident, not x̄.
    source: Mapping[str, torch.Tensor] | None
    if rho == 0:
        source = None  # no pull, no copy
    elif anchor is None:
        source = {n: p.detach().clone() for n, p in named}
    else:
        source = anchor
        missing = [n for n, _ in named if n not in anchor]
        if missing:
            raise KeyError(f"anchor lacks parameters {missing}")
    criterion = _criterion(loss)
    rows: Sequence[torch.Tensor] | torch.Tensor = (
        sample_batches(X.shape[0], batch_size, steps, generator) if batches is None else batches)

    def apply_step(p: torch.Tensor, name: str) -> None:
        g = p.grad
        if g is None:
            return
        with torch.no_grad():
            if source is not None:
                a = source[name].detach()
                # ∇ of ρ/2‖x − x̄‖² is ρ(x − x̄) = ρx − ρx̄: two in-place adds into the
                # gradient, no temporaries.
                g.add_(p, alpha=rho).add_(a, alpha=-rho)
            # Plain SGD: the very arithmetic of torch.optim.SGD without momentum, so ρ = 0
            # stays bit-identical to it. Not torch.optim itself: constructing an optimizer
            # imports torch._dynamo, ~75 MB resident for the daemon's whole life.
            p.add_(g, alpha=-lr)
        p.grad = None

    # The step runs inside backward, one parameter at a time, as soon as its gradient is
    # complete (autograd sums every use of a parameter before this hook fires), and frees
    # that gradient at once: a model's worth of gradients is never alive together, only the
    # layer being updated. Autograd's version counters turn any later use of an updated
    # parameter in the same backward into an error, never a silently wrong gradient.
    handles = [p.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                   lambda p, n=n: apply_step(p, n))
               for n, p in named]
    for p in params:
        p.grad = None  # a stale gradient left by the caller would be added into step 1
    model.train()
    # Where the batches are (the caller's device): no host sync per step to record a loss.
    losses = torch.zeros(steps, device=X.device)
    try:
        for k in range(steps):
            idx = rows[k]
            out = model(X[idx])
            value = criterion(out, y[idx]) if objective is None else objective(out, y[idx], idx)
            value.backward()  # type: ignore[no-untyped-call]
            losses[k] = value.detach()
    finally:
        for h in handles:
            h.remove()
        for p in params:
            p.grad = None
    if steps == 0:
        return LocalResult(0, float("nan"), float("nan"))
    return LocalResult(steps, float(losses.mean()), float(losses[-1]))


def stacked_step_(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    anchors: Sequence[torch.Tensor] | None,
    *,
    lr: float,
    rho: float,
) -> None:
    """One proximal step x ← x − η(g + ρ(x − x̄)) on every tensor of ``params``, in place.

    Written as x ← lerp(x, x̄, ηρ) − ηg (the same value: (1 − ηρ)x + ηρx̄ − ηg), so it is
    two fused passes over memory, each reading two tensors and writing one, instead of five
    that each allocate a result. Not the daemon's rounding order (that adds ρ(x − x̄) into g
    first), so the two agree to float32 rounding, not bit for bit. With ρ = 0 (or no
    anchors) it is ``x.add_(g, alpha=-η)``: torch.optim.SGD's arithmetic, like
    :func:`local_update`'s. ``grads`` are only read: vmap may hand back expanded views.
    """
    xs = list(params)
    if rho != 0 and anchors is not None:
        torch._foreach_lerp_(xs, list(anchors), lr * rho)
    torch._foreach_add_(xs, list(grads), alpha=-lr)


class GatheredBatches:
    """``x[idx]`` for ``idx`` ``[K, A, B]``, gathered one step at a time into one buffer.

    Gathering a whole round at once (``x[idx]``) materialises K·A·B samples, 200 MB for
    100 agents x 10 steps x 64 MNIST images, in fresh pages every round (a sixth of the
    round's time in the profile); step by step it is one step's worth, reused. Item ``k``
    is only valid until item ``k + 1`` is asked for, which is how the batched updates read
    it (each step's batch is dead once its gradient is taken).
    """

    def __init__(self, x: torch.Tensor, idx: torch.Tensor) -> None:
        if idx.dim() != 3:
            raise ValueError(f"idx must be [K, A, B], got {tuple(idx.shape)}")
        self.x = x
        self.idx = idx
        self.shape: tuple[int, ...] = (*idx.shape, *x.shape[1:])
        self._buf = torch.empty(0, dtype=x.dtype, device=x.device)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, k: int) -> torch.Tensor:
        rows = self.idx[k].reshape(-1)
        out = torch.index_select(self.x, 0, rows, out=self._buf)
        self._buf = out
        return out.view(self.shape[1:])


#: (stacked params, inputs ``[A, B, ...]``) -> outputs ``[A, B, ...]``: one architecture's
#: forward pass over A stacked models.
StackedForward = Callable[[Mapping[str, torch.Tensor], torch.Tensor], torch.Tensor]
#: (stacked params, stepped in place; inputs ``[A, B, ...]``; targets ``[A, B]``; anchors x̄
#: by name or None; lr; ρ) -> each agent's mean loss ``[A]`` before the step: one whole
#: proximal step of an architecture whose backward pass is written out, so the weight
#: gradient lands in the parameter (``baddbmm_``) and is never a tensor of its own.
FusedStep = Callable[[dict[str, torch.Tensor], torch.Tensor, torch.Tensor,
                      Mapping[str, torch.Tensor] | None, float, float], torch.Tensor]
StepGrad = Callable[[dict[str, torch.Tensor], torch.Tensor, torch.Tensor],
                    tuple[dict[str, torch.Tensor], torch.Tensor]]


def _stacked_grad(
    forward: StackedForward, criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> StepGrad:
    """What ``vmap(grad_and_value(task_loss))`` returns, by plain autograd over ``forward``.

    The gradient of the *sum* of the agents' mean losses: agent a's parameters reach only
    agent a's loss, so each stacked slice gets exactly its own agent's gradient.
    """

    def step(
        current: dict[str, torch.Tensor], x: torch.Tensor, t: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        names = list(current)
        leaves = {n: current[n].detach().requires_grad_() for n in names}
        out = forward(leaves, x)
        values = _per_agent(criterion, out, t)
        grads = torch.autograd.grad(values.sum(), [leaves[n] for n in names])
        return dict(zip(names, grads, strict=True)), values.detach()

    return step


def _per_agent(
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    out: torch.Tensor, t: torch.Tensor,
) -> torch.Tensor:
    """``[criterion(out[a], t[a]) for a]``: each agent's own mean, as local_update takes it on
    one agent's batch; cross-entropy as one call for all agents rather than A."""
    if criterion is nn.functional.cross_entropy:
        per = nn.functional.cross_entropy(out.flatten(0, 1), t.flatten(0, 1), reduction="none")
        return per.view(out.shape[0], -1).mean(dim=1)
    return torch.stack([criterion(out[a], t[a]) for a in range(out.shape[0])])


#: What the batched updates take as inputs: a ``[K, A, B, ...]`` tensor or the same gathered
#: lazily, one step at a time.
StepInputs = torch.Tensor | GatheredBatches


def batched_local_update(
    model: nn.Module,
    params: Mapping[str, torch.Tensor],
    X_batches: StepInputs,
    y_batches: torch.Tensor,
    *,
    lr: float,
    rho: float,
    loss: LossName,
    anchor: Mapping[str, torch.Tensor] | None = None,
    forward: StackedForward | None = None,
    fused: FusedStep | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """K proximal steps for A stacked models at once.

    ``params[name]`` is ``[A, *shape]``; ``X_batches`` is ``[K, A, B, ...]`` and ``y_batches``
    ``[K, A, B]`` (draw them with :func:`sample_batches` per agent; ``X_batches`` may be a
    :class:`GatheredBatches`). ``model`` supplies the architecture (and buffers) only.
    Returns the new stacked parameters (fresh tensors: ``params`` and ``anchor`` are left as
    they were) and the mean task loss per agent ``[A]``. Same step rule as
    :func:`local_update`, to float32 rounding (:func:`stacked_step_`).

    ``forward`` (stacked params, inputs ``[A, B, ...]``) -> outputs ``[A, B, ...]`` is the
    architecture's forward pass written over stacked parameters (e.g.
    :mod:`peerd.sim.stacked`); plain autograd then differentiates it instead of
    ``vmap(functional_call(model, ...))``. It must compute what ``model`` computes.
    ``fused`` (cross-entropy only, e.g. :func:`peerd.sim.stacked.fused_step`) replaces
    gradient and step both: the same step rule, to float32 rounding, in fewer passes over the
    stacked parameters.
    """
    if rho < 0 or lr <= 0:
        raise ValueError(f"need rho >= 0 and lr > 0 (got rho={rho}, lr={lr})")
    criterion = _criterion(loss)

    def task_loss(p: dict[str, torch.Tensor], x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return criterion(functional_call(model, p, (x,)), t)

    step_grad = (vmap(grad_and_value(task_loss)) if forward is None
                 else _stacked_grad(forward, criterion))
    # One private copy, stepped in place; the caller's tensors stay x̄ (contiguous whatever
    # the caller's strides, e.g. column slices of the simulator's [A, D] matrix).
    current = {n: t.detach().clone(memory_format=torch.contiguous_format)
               for n, t in params.items()}
    names = list(current)
    xs = [current[n] for n in names]
    source = params if anchor is None else anchor
    anchors = [source[n].detach() for n in names] if rho != 0 else None
    steps = X_batches.shape[0]
    agents = xs[0].shape[0]
    total = torch.zeros(agents)
    if fused is not None and loss != "cross_entropy":
        raise ValueError(f"a fused step takes cross-entropy, not {loss!r}")
    anchor_map = (dict(zip(names, anchors, strict=True))
                  if fused is not None and anchors is not None else None)
    for k in range(steps):
        if fused is not None:
            total += fused(current, X_batches[k], y_batches[k], anchor_map, lr, rho)
            continue
        grads, values = step_grad(current, X_batches[k], y_batches[k])
        stacked_step_(xs, [grads[n] for n in names], anchors, lr=lr, rho=rho)
        total += values.detach()
    mean = total / steps if steps else torch.full((agents,), float("nan"))
    return current, mean
