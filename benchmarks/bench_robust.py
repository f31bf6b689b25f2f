"""Robust blend rules against the weighted blend on the same stack (issue 15, item 2).

Run: ``.venv/bin/python -m benchmarks.bench_robust`` (``--quick`` for a smaller run,
``--no-write`` to print without updating docs/benchmarks.md and the readings,
docs/reproduction/robust.json, which the section is rendered from; ``--render`` to re-render;
``--params``/``--models`` to size).

Both forms are timed: the whole-stack function (``robust_blend_rows``, the simulator's shape)
against ``blend_rows``, and the daemon's in-place block-wise form (``robust_blend_into`` over
separate models) against ``blend_into``. Ratios are time / the weighted blend's time, measured
interleaved in one run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import _provenance
from benchmarks._report import interleaved, machine, readings_parser, run_section
from peerd.core.blend import blend_into, blend_rows
from peerd.core.robust import (
    Clipped,
    Krum,
    Median,
    RobustRule,
    Trimmed,
    robust_blend_into,
    robust_blend_rows,
)

RULES: dict[str, RobustRule] = {"median": Median(), "trimmed:0.1": Trimmed(0.1),
                                "clipped:1.0": Clipped(1.0), "krum:1": Krum(1)}


def bench(params: int, models: int, repeat: int) -> dict[str, tuple[float, float]]:
    g = torch.Generator().manual_seed(0)
    stack = torch.randn(models, params, generator=g)
    alpha = [1.0 / models] * models
    separate = [{"w": stack[i].clone()} for i in range(models)]
    dest = {"w": torch.empty(params)}
    rows: dict[str, Callable[[], object]] = {"weighted": lambda: blend_rows(stack, alpha)}
    into: dict[str, Callable[[], object]] = {"weighted": lambda: blend_into(dest, separate, alpha)}
    for name, rule in RULES.items():
        rows[name] = lambda r=rule: robust_blend_rows(stack, alpha, r)  # type: ignore[misc]
        into[name] = lambda r=rule: robust_blend_into(dest, separate, alpha, r)  # type: ignore[misc]
    t_rows = interleaved(rows, repeat)
    t_into = interleaved(into, repeat)
    return {k: (t_rows[k], t_into[k]) for k in rows}


#: The committed readings the doc's section is rendered from (docs_tables re-renders it).
READINGS = Path(__file__).resolve().parent.parent / "docs" / "reproduction" / "robust.json"


def render(r: dict[str, Any]) -> str:
    """The doc's section from one run's readings."""
    t = {name: tuple(pair) for name, pair in r["seconds"].items()}
    w_rows, w_into = t["weighted"]
    lines = "\n".join(
        f"| {name} | {rows * 1e3:.1f} ms | {rows / w_rows:.2f}× | {into * 1e3:.1f} ms | "
        f"{into / w_into:.2f}× |" for name, (rows, into) in t.items())
    flags = (" --quick" if r["quick"] else "") + (
        f" --params {r['params_flag']}" if r["params_flag"] else "") + (
        f" --models {r['models']}" if r["models"] != 11 else "")
    tail = f"\n{_provenance.line(r['provenance'])}\n" if "provenance" in r else ""
    return f"""## Robust blend rules — `python -m benchmarks.bench_robust{flags}`

Machine: {r['machine']}

{r['models']} models (own + C = {r['models'] - 1}) × {r['params'] / 1e6:.1f}M float32, median of {r['repeat']}
interleaved repetitions. Ratio: time / the weighted blend's time in the same run.

| rule | whole stack (`robust_blend_rows`) | ratio | in place, block-wise (`robust_blend_into`) | ratio |
|---|---|---|---|---|
{lines}

Clipping and Krum are a float64 statistics pass (norms to the own model; pairwise distances)
followed by the weighted blend with the weights they chose; the trimmed mean sorts every column
block, the median of an odd count selects its middle value (`torch.median`).
{tail}"""


def measure(quick: bool, params_flag: int | None, models: int) -> dict[str, Any]:
    params = params_flag or (200_000 if quick else 2_000_000)
    rep = 3 if quick else 7
    return {"quick": quick, "params_flag": params_flag, "params": params, "models": models,
            "repeat": rep, "machine": machine(),
            "seconds": {k: list(v) for k, v in bench(params, models, rep).items()}}


def main() -> None:
    ap = readings_parser(__doc__)
    ap.add_argument("--params", type=int, default=None)
    ap.add_argument("--models", type=int, default=11)
    args = ap.parse_args()
    run_section("robust", ap, args, READINGS,
                lambda: measure(args.quick, args.params, args.models), render)


if __name__ == "__main__":
    main()
