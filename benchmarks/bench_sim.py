"""Simulator benchmark: one round of training for all agents, batched (vmap) vs per-agent loop.

Run: ``.venv/bin/python -m benchmarks.bench_sim`` (``--quick`` for a smaller smoke run;
``--no-write`` to print without updating docs/benchmarks.md).

Both paths train the same agents from the same models on the same mini-batches (the batched
path is tested to agree with the loop to float tolerance), in the same process, alternating
repetitions; the median is reported. Target (issue 6): batched >= 3x the per-agent loop.
Throughput is agent-steps per second (one agent doing one local SGD step = 1).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks import _provenance
from benchmarks._report import interleaved, machine, write_section
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller configs, fewer repeats")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    started = _provenance.start(parser, args)
    torch.set_num_threads(args.threads)
    repeat = 2 if args.quick else 3
    # The paper's CNN at the paper's N = 100 but one step: its loop runs ~20 agent-steps/s.
    configs = [("digits", "mlp", 100, 10)]
    if not args.quick:
        configs += [("mnist", "mlp", 100, 10), ("mnist", "cnn", 100, 1)]
    rows = []
    for dataset, kind, agents, steps in configs:
        r = bench_training(dataset, kind, agents, steps, repeat)
        rows.append((f"{dataset} / {kind}", agents, steps, r))
        print(
            f"{dataset}/{kind}: N={agents} K={steps} params={r['params']:.0f}  "
            f"batched {r['batched_s']:.3f} s ({r['batched_steps_per_s']:.0f} agent-steps/s)  "
            f"loop {r['loop_s']:.3f} s ({r['loop_steps_per_s']:.0f} agent-steps/s)  "
            f"speedup {r['speedup']:.2f}x"
        )
    full = bench_full_round(2 if args.quick else 5)
    print(
        f"full cached-dfl round, digits N=100 K=10: {full['seconds_per_round']:.2f} s/round "
        f"({full['agent_steps_per_s']:.0f} agent-steps/s incl. mobility, merge, blend, eval)"
    )
    lines = [
        "## Simulator (`peerd sim`): batched vs per-agent training",
        "",
        f"Machine: {machine()}. Command: `.venv/bin/python -m benchmarks.bench_sim"
        f"{' --quick' if args.quick else ''}`. One round of K local steps (batch 64, ρ=0.01) for "
        "all agents; median of interleaved repetitions. Goal: batched ≥ 3× the loop.",
        "",
        "| data / model | N | K | batched s | loop s | speedup | batched agent-steps/s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, agents, steps, r in rows:
        lines.append(
            f"| {label} ({r['params']:.0f} params) | {agents} | {steps} | {r['batched_s']:.3f} "
            f"| {r['loop_s']:.3f} | {r['speedup']:.2f}× | {r['batched_steps_per_s']:.0f} |"
        )
    lines += [
        "",
        f"Whole simulated cached-dfl rounds (digits, N=100, K=10, 120 s of mobility, merges, "
        f"blend, evaluation on the full test set): {full['seconds_per_round']:.2f} s per round, "
        f"{full['agent_steps_per_s']:.0f} agent-steps/s, {full['merges_per_round']:.0f} cache "
        "merges per round.",
        "",
        _provenance.line(started.record()),
    ]
    if not args.no_write:
        write_section("sim", "\n".join(lines))


if __name__ == "__main__":
    main()
