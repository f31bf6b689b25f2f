"""The proximal term ρ/2‖x − x̄‖² for a learner's own loop, with any optimizer.

Cached-DFL's local step (lecture §3.7) minimises f(x) + ρ/2‖x − x̄‖², x̄ the blend of the
cache (the ``anchor`` a learner's ``fit`` is given). It is FedProx's term with ρ = μ (Flower
sends it as ``"proximal-mu"``); ρ = 0 is plain local training. Two equivalent ways to add it:

* :meth:`Proximal.term` — a loss to add before ``backward()``::

      prox = Proximal(model, anchor, config.rho)
      loss = criterion(model(x), y) + prox.term()
      loss.backward(); opt.step()

* :meth:`Proximal.add_grad` — the gradient ρ(x − x̄) added after ``backward()`` and before
  ``opt.step()``: the same gradient without the term in the autograd graph (cheaper for big
  models; works when the loss is produced by code you do not control, e.g. a Lightning
  module or an AMP ``GradScaler`` that has already unscaled the gradients)::

      loss.backward(); prox.add_grad(); opt.step()

Either way the optimizer sees ∇f + ρ(x − x̄): momentum, Adam's moments, weight decay and
gradient clipping act on the sum, as in FedProx's reference implementation. Only trainable
parameters are pulled towards x̄; buffers (batch-norm statistics) are not parameters of the
objective. x̄ is copied once to each parameter's device and dtype and kept for the round.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn


class ProximalError(ValueError):
    """The anchor does not cover the model's trainable parameters; the message says which."""


class Proximal:
    """ρ/2‖x − x̄‖² over ``model``'s trainable parameters, x̄ = ``anchor`` (by name, as in
    ``model.state_dict()``)."""

    def __init__(self, model: nn.Module, anchor: Mapping[str, torch.Tensor], rho: float) -> None:
        if rho < 0:
            raise ProximalError(f"rho must be >= 0 (got {rho})")
        self.rho = float(rho)
        self._pairs: list[tuple[nn.Parameter, torch.Tensor]] = []
        if self.rho == 0.0:
            return  # skipped, not multiplied by 0: plain training bit for bit
        missing = []
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            a = anchor.get(name)
            if a is None:
                missing.append(name)
                continue
            if a.shape != p.shape:
                raise ProximalError(f"anchor {name!r} has shape {tuple(a.shape)}, "
                                    f"the parameter {tuple(p.shape)}")
            # One copy on the parameter's device, detached: x̄ is a constant of the round.
            self._pairs.append((p, a.detach().to(device=p.device, dtype=p.dtype, copy=True)))
        if missing:
            shown = ", ".join(missing[:3]) + (" …" if len(missing) > 3 else "")
            raise ProximalError(f"the anchor lacks {len(missing)} trainable parameters: {shown}")

    def term(self) -> torch.Tensor:
        """ρ/2 Σ‖p − x̄_p‖² as a scalar in the autograd graph (0 when ρ = 0)."""
        if not self._pairs:
            return torch.zeros(())
        total = sum(((p - a) ** 2).sum() for p, a in self._pairs)
        assert isinstance(total, torch.Tensor)
        return 0.5 * self.rho * total

    @torch.no_grad()
    def add_grad(self) -> None:
        """Add ρ(x − x̄) into each parameter's ``.grad`` (after backward, before the step)."""
        for p, a in self._pairs:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.add_(p - a, alpha=self.rho)
