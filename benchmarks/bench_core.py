"""Core benchmarks: blend throughput, proximal-update overhead, merge scaling.

Run: ``.venv/bin/python -m benchmarks.bench_core`` (add ``--quick`` for a smaller smoke run;
``--no-write`` to print without updating docs/benchmarks.md and the readings,
docs/reproduction/core.json, which the section is rendered from; ``--render`` to re-render).

Targets (issue 2): blend ≥ 0.8× a bare ``torch.matmul`` over the same stacked data; K=10
proximal steps ≤ 1.10× a plain ``torch.optim.SGD`` loop on the MNIST CNN; merge time linear
in the number of received entries.
"""

from __future__ import annotations

import functools
import gc
import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks import _provenance
from benchmarks._report import interleaved, machine, readings_parser, run_section
from peerd.core.blend import ModelStack
from peerd.core.cache import merge
from peerd.core.entry import CacheItem, EntryMeta, Schema
from peerd.core.local_update import local_update, sample_batches
from peerd.core.staleness import Clock
from peerd.learn.models import build_model, count_parameters


def bench_blend(params: int, models: int, repeat: int) -> dict[str, float]:
    schema = Schema.of({"w": torch.zeros(params)})
    stack = ModelStack(schema, rows=models)
    g = torch.Generator().manual_seed(0)
    for i in range(models):
        stack.put(f"n{i}", torch.randn(params, generator=g))
    alpha = {f"n{i}": 1.0 / models for i in range(models)}
    weights = torch.full((models,), 1.0 / models)
    matrix = stack.occupied
    times = interleaved(
        {"blend": lambda: stack.blend(alpha), "matmul": lambda: torch.matmul(weights, matrix)},
        repeat,
    )
    gb = models * params * 4 / 1e9
    return {"blend_gbs": gb / times["blend"], "matmul_gbs": gb / times["matmul"],
            "ratio": times["matmul"] / times["blend"]}


def bench_local_update(steps: int, repeat: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(2048, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (2048,), generator=g)
    ours = build_model("cnn", (1, 28, 28), 10, seed=0)
    plain = build_model("cnn", (1, 28, 28), 10, seed=0)
    opt = torch.optim.SGD(plain.parameters(), lr=0.01)
    init = {k: v.clone() for k, v in ours.state_dict().items()}

    # Both sides restart from the same weights every repetition, so neither drifts into a
    # different numeric regime (e.g. denormals) over the repeated runs.
    def run_ours() -> None:
        ours.load_state_dict(init)
        local_update(ours, X, y, steps=steps, batch_size=64, lr=0.01, rho=0.1,
                     loss="cross_entropy", generator=torch.Generator().manual_seed(1))

    def run_plain() -> None:
        # The textbook loop with the same batches; no proximal term.
        plain.load_state_dict(init)
        for idx in sample_batches(len(X), 64, steps, torch.Generator().manual_seed(1)):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(plain(X[idx]), y[idx])
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            opt.step()

    times = interleaved({"ours": run_ours, "plain": run_plain}, repeat)
    return {"params": float(count_parameters(ours)), "ours_s": times["ours"],
            "plain_s": times["plain"], "ratio": times["ours"] / times["plain"]}


def _received(n: int, origins: int) -> list[CacheItem]:
    out = []
    for i in range(n):
        o, v = f"node{i % origins}", i // origins + (i * 7919) % 5
        meta = EntryMeta(o, v, float(v), "s" * 64, 100,
                         hashlib.sha256(f"{o}{v}{i % 3}".encode()).hexdigest())
        out.append(CacheItem(meta, f"peer{i % 7}", float(i)))
    return out


def bench_merge(sizes: tuple[int, ...], repeat: int) -> dict[int, float]:
    held = _received(10, 10)
    out = {}
    for n in sizes:
        received = _received(n, max(10, n // 4))
        clock = Clock.rounds(n)
        # A partial, not a lambda: typed, and it binds this iteration's values (ruff B023).
        run = functools.partial(merge, held, received, clock=clock, tau_max=n, capacity=10)
        t = interleaved({"m": run}, repeat)["m"]
        out[n] = t
    return out


#: The committed readings the doc's section is rendered from (docs_tables re-renders it).
READINGS = Path(__file__).resolve().parent.parent / "docs" / "reproduction" / "core.json"


def measure(quick: bool) -> dict[str, Any]:
    """Every reading of the section, JSON-able (merge sizes as string keys)."""
    params = 1_100_000 if quick else 11_000_000
    rep = 3 if quick else 9
    blend = bench_blend(params, 10, rep)
    lu = bench_local_update(10, rep)
    # Merges take milliseconds: many more repetitions, and no GC pauses inside the timings.
    gc.disable()
    try:
        mg = bench_merge((1_000, 10_000), rep * 5)
    finally:
        gc.enable()
    return {"quick": quick, "params": params, "repeat": rep, "blend": blend,
            "local_update": lu, "merge_s": {str(n): t for n, t in mg.items()},
            "machine": machine()}


def render(r: dict[str, Any]) -> str:
    """The doc's section from one run's readings."""
    blend, lu, params = r["blend"], r["local_update"], r["params"]
    mg = {int(n): t for n, t in r["merge_s"].items()}
    per_entry = {n: t / n * 1e6 for n, t in mg.items()}
    linear_ratio = (mg[10_000] / mg[1_000]) / 10
    tail = f"\n{_provenance.line(r['provenance'])}\n" if "provenance" in r else ""
    return f"""## Core (`peerd.core`) — `python -m benchmarks.bench_core{' --quick' if r['quick'] else ''}`

Machine: {r['machine']}

| benchmark | ours | baseline (same run) | ratio | goal |
|---|---|---|---|---|
| blend, C=10 × {params / 1e6:.1f}M float32 | {blend['blend_gbs']:.2f} GB/s | `torch.matmul` {blend['matmul_gbs']:.2f} GB/s | {blend['ratio']:.2f}× of matmul | ≥ 0.8× |
| K=10 proximal steps (ρ=0.1), CNN {lu['params'] / 1e3:.0f}k params, batch 64 | {lu['ours_s'] * 1e3:.1f} ms | plain `torch.optim.SGD` loop {lu['plain_s'] * 1e3:.1f} ms | {lu['ratio']:.3f}× the time | ≤ 1.10× |
| merge 1,000 received entries into C=10 | {mg[1_000] * 1e3:.2f} ms ({per_entry[1_000]:.2f} µs/entry) | | | |
| merge 10,000 received entries into C=10 | {mg[10_000] * 1e3:.2f} ms ({per_entry[10_000]:.2f} µs/entry) | 10× the 1,000 run | {linear_ratio:.2f}× linear | ≈ 1× (linear) |
{tail}"""


def main() -> None:
    ap = readings_parser(__doc__)
    args = ap.parse_args()
    run_section("core", ap, args, READINGS, lambda: measure(args.quick), render)


if __name__ == "__main__":
    main()
