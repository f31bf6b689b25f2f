"""Simulator benchmark: one round of training for all agents, batched (vmap) vs per-agent loop.

    .venv/bin/python -m benchmarks.bench_sim [--threads N] [--quick] [--no-write] [--render]

The readings (with their provenance) go to docs/reproduction/sim.json and the section of
docs/benchmarks.md is rendered from them (``--render`` re-renders without measuring;
benchmarks/docs_tables.py and tests/docs re-render and diff it).

Both paths train the same agents from the same models on the same mini-batches (the batched
path is tested to agree with the loop to float tolerance), in the same process, alternating
repetitions; the median is reported. Target (issue 6): batched >= 3x the per-agent loop.
Throughput is agent-steps per second (one agent doing one local SGD step = 1).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks._report import interleaved
from peerd.core.entry import flatten
from peerd.learn.data import load_dataset, partition
from peerd.learn.models import build_model, default_model_kind
from peerd.sim.runner import SimConfig, run
from peerd.sim.train import draw_batches, model_schema, train_batched, train_loop


def bench_training(
    dataset: str, kind: str, agents: int, steps: int, repeat: int, rho: float = 0.01
) -> dict[str, float]:
    ds = load_dataset(dataset)
    parts = partition(ds.y_train, agents, "shards", np.random.default_rng(0))
    model = build_model(kind or default_model_kind(dataset), ds.input_shape, ds.num_classes, seed=0)
    schema = model_schema(model)
    init = flatten(dict(model.named_parameters()), schema)
    matrix = init + 0.01 * torch.randn(
        agents, init.numel(), generator=torch.Generator().manual_seed(0)
    )
    batches = draw_batches(parts, steps, 64, seed=0, round_index=0)

    def batched() -> object:
        return train_batched(
            model, matrix, schema, ds.x_train, ds.y_train, batches, lr=0.1, rho=rho
        )

    def loop() -> object:
        return train_loop(
            model,
            matrix,
            schema,
            ds.x_train,
            ds.y_train,
            parts,
            steps=steps,
            batch_size=64,
            lr=0.1,
            rho=rho,
            seed=0,
            round_index=0,
        )

    times = interleaved({"batched": batched, "loop": loop}, repeat)
    work = agents * steps
    return {
        "batched_s": times["batched"],
        "loop_s": times["loop"],
        "speedup": times["loop"] / times["batched"],
        "batched_steps_per_s": work / times["batched"],
        "loop_steps_per_s": work / times["loop"],
        "params": float(schema.flat_size),
    }


def bench_full_round(rounds: int) -> dict[str, float]:
    """Whole simulated rounds of cached-dfl on digits, N=100 (train, contacts, merge, blend,
    evaluate on the full test set)."""
    cfg = SimConfig(
        dataset="digits",
        partition="shards",
        agents=100,
        rounds=rounds,
        local_steps=10,
        algorithms=("cached-dfl",),
        seed=0,
    )
    t0 = time.perf_counter()
    result = run(cfg)
    total = time.perf_counter() - t0
    return {
        "seconds_per_round": total / rounds,
        "agent_steps_per_s": 100 * 10 * rounds / total,
        "merges_per_round": result.info["cache_merges"] / rounds,
    }


#: The committed readings the doc's section is rendered from (docs_tables re-renders it).
READINGS = Path(__file__).resolve().parent.parent / "docs" / "reproduction" / "sim.json"


def measure(threads: int, quick: bool) -> dict[str, Any]:
    """Every reading of the section, JSON-able."""
    torch.set_num_threads(threads)
    repeat = 2 if quick else 3
    # The paper's CNN at the paper's N = 100 but one step: its loop runs ~20 agent-steps/s.
    configs = [("digits", "mlp", 100, 10)]
    if not quick:
        configs += [("mnist", "mlp", 100, 10), ("mnist", "cnn", 100, 1)]
    rows = []
    for dataset, kind, agents, steps in configs:
        r = bench_training(dataset, kind, agents, steps, repeat)
        rows.append({"data": dataset, "model": kind, "agents": agents, "steps": steps, **r})
    rounds = 2 if quick else 5
    full = bench_full_round(rounds)
    return {"repeat": repeat, "batch": 64, "rho": 0.01, "training": rows,
            "full_round": {"rounds": rounds, **full}}


def render(r: dict[str, Any]) -> str:
    """The doc's section from one run's readings."""
    lines = [
        "## Simulator (`peerd sim`): batched vs per-agent training",
        "",
        f"One round of K local steps (batch {r['batch']}, ρ={r['rho']}) for all agents; median "
        f"of {r['repeat']} interleaved repetitions, both paths in the same process. "
        "Goal: batched ≥ 3× the loop.",
        "",
        "| data / model | N | K | batched s | loop s | speedup | batched agent-steps/s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in r["training"]:
        lines.append(
            f"| {t['data']} / {t['model']} ({t['params']:.0f} params) | {t['agents']} "
            f"| {t['steps']} | {t['batched_s']:.3f} | {t['loop_s']:.3f} | {t['speedup']:.2f}× "
            f"| {t['batched_steps_per_s']:.0f} |"
        )
    full = r["full_round"]
    lines += [
        "",
        f"Whole simulated cached-dfl rounds ({full['rounds']} rounds of digits, N=100, K=10, "
        "120 s of mobility, merges, blend, evaluation on the full test set): "
        f"{full['seconds_per_round']:.2f} s per round, {full['agent_steps_per_s']:.0f} "
        f"agent-steps/s, {full['merges_per_round']:.0f} cache merges per round.",
    ]
    if "provenance" in r:
        from benchmarks import _provenance  # needs `python -m` from the repo root

        lines += ["", _provenance.line(r["provenance"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    from benchmarks._report import readings_parser, run_section  # `python -m` from the root

    parser = readings_parser(__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    run_section("sim", parser, args, READINGS, lambda: measure(args.threads, args.quick), render)


if __name__ == "__main__":
    main()
