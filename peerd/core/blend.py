"""The α-weighted blend x = Σ α_j x_j (lecture §3.6) as one matrix product.

Models live as rows of a float32 matrix (see :class:`ModelStack`) so blending C models of D
parameters is a single ``[n] @ [n, D]`` product: memory-bound, reading each weight once.
A Python loop of ``out += α_j x_j`` would read and write the accumulator C times (~3× the
traffic), and stacking separate tensors on every blend would copy every model first.
:func:`blend_into` is the daemon's variant: block by block over separate models, in place.

It never chooses members or weights (:mod:`peerd.core.plan`, :mod:`peerd.core.alpha`; it
only checks α) and writes nothing but its output (``out``, ``dest``, a stack row).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
import torch

from peerd.core.alpha import AlphaError
from peerd.core.entry import Schema, flatten, unflatten

#: α must sum to one; float64 rounding of a normalised vector stays far inside this.
ALPHA_SUM_TOLERANCE = 1e-9
#: Columns per block in :func:`blend_into`: the ``[n, block]`` gather buffer stays a few MB
#: (cache-sized) however large the model is, instead of n full model copies.
BLEND_BLOCK = 1 << 16


def block_schema(dest: Mapping[str, torch.Tensor],
                 models: Sequence[Mapping[str, torch.Tensor]], block: int) -> Schema:
    """The schema every block-wise blend walks: ``dest``'s, which each model must share."""
    if block <= 0:
        raise ValueError("block must be positive")
    schema = Schema.of(dest)
    for m in models:
        if Schema.of(m).id != schema.id:
            raise ValueError("cannot blend models with different schemas")
    return schema


def _check_alpha(alpha: torch.Tensor, n: int) -> None:
    if alpha.shape[-1] != n:
        raise AlphaError(f"{alpha.shape[-1]} weights for {n} models")
    a64 = alpha.detach().to(torch.float64)
    if not bool(torch.isfinite(a64).all()):
        raise AlphaError("non-finite alpha")
    if bool((a64 < 0).any()):
        raise AlphaError("negative alpha")
    sums = a64.sum(dim=-1)
    if bool(((sums - 1.0).abs() > ALPHA_SUM_TOLERANCE).any()):
        raise AlphaError(f"alpha must sum to 1, sums are {sums.tolist()}")


def blend_rows(
    matrix: torch.Tensor,
    alpha: torch.Tensor | npt.NDArray[np.float64] | Sequence[float],
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``alpha @ matrix``: ``alpha`` is ``[n]`` (one blend) or ``[b, n]`` (b blends at once).

    ``matrix`` is ``[n, D]`` float32. Returns ``[D]`` or ``[b, D]`` float32.
    """
    if matrix.dim() != 2:
        raise ValueError(f"matrix must be [n, D], got shape {list(matrix.shape)}")
    a = torch.as_tensor(alpha, dtype=torch.float64)
    if a.dim() not in (1, 2):
        raise AlphaError(f"alpha must be [n] or [b, n], got shape {list(a.shape)}")
    _check_alpha(a, matrix.shape[0])
    a32 = a.to(matrix.dtype)
    if out is None:
        return a32 @ matrix
    return torch.matmul(a32, matrix, out=out)


def blend(
    models: Sequence[Mapping[str, torch.Tensor]],
    alpha: torch.Tensor | npt.NDArray[np.float64] | Sequence[float],
) -> dict[str, torch.Tensor]:
    """Blend whole models (convenience for tests and small callers; stacks them first).

    Non-floating buffers are taken from ``models[0]`` (the caller's own model by convention):
    averaging counters is meaningless. All models must share one schema.
    """
    if not models:
        raise AlphaError("nothing to blend")
    schema = Schema.of(models[0])
    for m in models[1:]:
        if Schema.of(m).id != schema.id:
            raise ValueError("cannot blend models with different schemas")
    stack = torch.empty(len(models), schema.flat_size, dtype=torch.float32)
    for i, m in enumerate(models):
        flatten(m, schema, out=stack[i])
    return unflatten(blend_rows(stack, alpha), schema, extras=models[0])


def blend_into(
    dest: Mapping[str, torch.Tensor],
    models: Sequence[Mapping[str, torch.Tensor]],
    alpha: torch.Tensor | npt.NDArray[np.float64] | Sequence[float],
    *,
    block: int = BLEND_BLOCK,
) -> None:
    """Write ``Σ α_j models[j]`` into ``dest``'s floating tensors, in place.

    The daemon's blend: its models are separate signed payloads, so :func:`blend` would first
    stack them (n model copies) and then allocate the result. Here the product runs one
    column block at a time, ``[n] @ [n, block]``, over a gather buffer of ``n × block``
    floats, straight into ``dest``. ``dest`` may be one of ``models`` (the own model
    blending itself with its cache): each block is gathered before it is overwritten.
    Non-floating tensors of ``dest`` are left alone.
    """
    if not models:
        raise AlphaError("nothing to blend")
    schema = block_schema(dest, models, block)
    n = len(models)
    a = torch.as_tensor(alpha, dtype=torch.float64)
    if a.dim() != 1:
        raise AlphaError(f"alpha must be [n], got shape {list(a.shape)}")
    _check_alpha(a, n)
    a32 = a.to(torch.float32)
    width = min(block, max((s.numel for s in schema.float_specs), default=1))
    gather = torch.empty(n, width, dtype=torch.float32)
    with torch.no_grad():
        for s in schema.float_specs:
            target = dest[s.name].detach()
            sources = [m[s.name].detach().reshape(-1) for m in models]
            # Params are contiguous float32 in practice; anything else (a transposed view, a
            # bfloat16 model) is blended into a float32 copy of that one tensor, then cast back.
            direct = target.is_contiguous() and target.dtype == torch.float32
            flat = target.view(-1) if direct else torch.empty(s.numel, dtype=torch.float32)
            for lo in range(0, s.numel, width):
                hi = min(lo + width, s.numel)
                g = gather[:, : hi - lo]
                for row, src in enumerate(sources):
                    g[row].copy_(src[lo:hi])
                torch.mv(g.t(), a32, out=flat[lo:hi])  # [n] @ [n, b], no transposed copy
            if not direct:
                target.copy_(flat.view(target.shape))


class ModelStack:
    """Up to ``rows`` flat models, kept compact in the first rows of one float32 matrix.

    Keys (origin ids) map to rows; removing a row moves the last one into the hole so the
    occupied block ``matrix[:len]`` stays a view and blending never gathers or copies.
    """

    def __init__(self, schema: Schema, rows: int) -> None:
        if rows <= 0:
            raise ValueError("a model stack needs at least one row")
        self.schema = schema
        self._matrix = torch.zeros(rows, schema.flat_size, dtype=torch.float32)
        self._keys: list[str] = []

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self._keys)

    @property
    def occupied(self) -> torch.Tensor:
        """The ``[len, D]`` view of occupied rows, in :attr:`keys` order."""
        return self._matrix[: len(self._keys)]

    def row(self, key: str) -> torch.Tensor:
        return self._matrix[self._keys.index(key)]

    def put(self, key: str, params: Mapping[str, torch.Tensor] | torch.Tensor) -> None:
        """Insert or overwrite ``key`` with a model (named tensors or a flat vector)."""
        if key in self._keys:
            i = self._keys.index(key)
        elif len(self._keys) < self._matrix.shape[0]:
            i = len(self._keys)
            self._keys.append(key)
        else:
            raise ValueError(f"model stack is full ({self._matrix.shape[0]} rows)")
        if isinstance(params, torch.Tensor):
            if params.shape != (self.schema.flat_size,):
                raise ValueError(f"flat vector must be [{self.schema.flat_size}]")
            self._matrix[i].copy_(params)
        else:
            flatten(params, self.schema, out=self._matrix[i])

    def remove(self, key: str) -> None:
        i = self._keys.index(key)
        last = len(self._keys) - 1
        if i != last:
            self._matrix[i].copy_(self._matrix[last])
            self._keys[i] = self._keys[last]
        self._keys.pop()

    def retain(self, keys: Sequence[str]) -> None:
        """Drop every row whose key is not in ``keys``."""
        wanted = set(keys)
        for key in [k for k in self._keys if k not in wanted]:
            self.remove(key)

    def blend(self, alpha: Mapping[str, float]) -> torch.Tensor:
        """Blend the rows named in ``alpha`` (absent rows get weight 0)."""
        unknown = set(alpha) - set(self._keys)
        if unknown:
            raise KeyError(f"no row for {sorted(unknown)}")
        weights = torch.tensor([alpha.get(k, 0.0) for k in self._keys], dtype=torch.float64)
        return blend_rows(self.occupied, weights)
