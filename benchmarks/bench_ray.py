"""Simulator engines: training throughput of local vs Ray (1 and 2 workers), and a large run.

Run: ``.venv/bin/python -m benchmarks.bench_ray`` (``--quick`` for a smoke run, ``--no-write``
to print only; needs ``pip install 'peerd[ray]'``).

Part 1 trains one round of K local steps for N agents, cut into shards, on three engines in
the same process against one 3-CPU local Ray cluster: :class:`peerd.sim.engine.LocalEngine`
(every shard here, one after another) and :class:`peerd.sim.rayengine.RayEngine` with 1 and 2
actors; repetitions alternate between engines and the median is reported, as agent-steps/s
(one agent doing one SGD step = 1) and as a ratio to the local engine. It also checks that
the three return the same bytes. Part 2 is a whole ``peerd sim`` run of 1,000 digits agents
on the Ray engine (its rounds and wall time). Raw numbers go to ``--out`` (``ray.json``), the
table to docs/benchmarks.md's ``ray`` section.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import _provenance
from benchmarks._report import interleaved, machine, write_section
from peerd.learn.data import load_dataset, partition
from peerd.learn.models import build_model, default_model_kind
from peerd.sim.engine import Engine, LocalEngine, TrainSetup, TrainTask
from peerd.sim.rayengine import RayEngine
from peerd.sim.runner import SimConfig, run
from peerd.sim.train import model_schema

OUT = Path(__file__).resolve().parent.parent / "docs" / "reproduction" / "ray"


def bench_engines(dataset: str, part: str, agents: int, steps: int, shard_agents: int,
                  repeat: int) -> dict[str, Any]:
    """Median seconds of one round's training on local, ray x1, ray x2 (same shards)."""
    ds = load_dataset(dataset)
    parts = partition(ds.y_train, agents, part, np.random.default_rng(0))
    kind = default_model_kind(dataset)
    model = build_model(kind, ds.input_shape, ds.num_classes, seed=0)
    setup = TrainSetup(model, ds.x_train, ds.y_train, parts)
    schema = model_schema(model)
    matrix = 0.01 * torch.randn(agents, schema.flat_size,
                                generator=torch.Generator().manual_seed(0))
    task = TrainTask(mode="batched", round_index=0, seed=0, steps=steps, batch_size=64,
                     lr=0.1, rho=0.01)
    engines: dict[str, Engine] = {"local": LocalEngine()}
    ray_engines = [RayEngine(workers=1), RayEngine(workers=2)]
    engines["ray x1"], engines["ray x2"] = ray_engines
    try:
        for engine in engines.values():
            engine.load(setup, shard_agents)
        outputs = {name: engine.train(task, matrix) for name, engine in engines.items()}
        same = all(torch.equal(out[0], outputs["local"][0]) and
                   torch.equal(out[1], outputs["local"][1]) for out in outputs.values())
        fns: dict[str, Callable[[], object]] = {
            name: functools.partial(engine.train, task, matrix) for name, engine in engines.items()
        }
        times = interleaved(fns, repeat)
    finally:
        for engine in ray_engines:
            engine.close()
    work = agents * steps
    return {
        "dataset": dataset, "partition": part, "model": kind, "params": schema.flat_size, "agents": agents,
        "steps": steps, "shard_agents": shard_agents, "repeat": repeat,
        "identical_bytes": same,
        "seconds": times,
        "agent_steps_per_s": {k: work / v for k, v in times.items()},
        "ratio_to_local": {k: times["local"] / v for k, v in times.items()},
    }


def bench_large(agents: int, rounds: int, workers: int, shard_agents: int,
                out: Path) -> dict[str, Any]:
    """A whole cached-dfl run of ``agents`` digits agents on Ray (``workers`` actors)."""
    # iid: digits' 1,348 training samples cannot fill 2 label shards for each of 1,000 agents.
    cfg = SimConfig(dataset="digits", partition="iid", agents=agents, rounds=rounds,
                    local_steps=10, algorithms=("cached-dfl",), seed=0,
                    shard_agents=shard_agents)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with RayEngine(workers=workers) as engine:
        result = run(cfg, engine=engine)
    wall = time.perf_counter() - start
    summary = result.summary()
    (out / "large-summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    res = summary["results"]["cached-dfl"]
    return {
        "agents": agents, "rounds": rounds, "workers": workers, "shard_agents": shard_agents,
        "wall_seconds": wall, "seconds_per_round": wall / rounds,
        "train_seconds": result.info["train_seconds"],
        "train_agent_steps_per_s": result.info["agent_steps_per_second"],
        "cache_merges": result.info["cache_merges"],
        "final_accuracy_mean": res["final_accuracy_mean"],
        "cache_avg_models": res["cache_avg_models"],
        "load_average_1min": [load_before, os.getloadavg()[0]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller configs, fewer repeats")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/")
    parser.add_argument("--render", action="store_true",
                        help="measure nothing: rewrite the section from --out's ray.json")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--large-agents", type=int, default=1000)
    parser.add_argument("--large-rounds", type=int, default=5)
    args = parser.parse_args()
    if args.render:
        write_section("ray", render(json.loads((args.out / "ray.json").read_text())))
        return
    started = _provenance.start(parser, args)
    import ray

    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    # 3 logical CPUs: the 1- and 2-actor engines stay up side by side for interleaving (each
    # actor holds one CPU for its life); the machine's cores are what they share.
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    load_before = os.getloadavg()[0]
    try:
        quick = args.quick
        # MNIST's CNN (the paper's model): enough arithmetic per shard that training, not
        # Ray's dispatch, is what is timed.
        engines = (bench_engines("digits", "shards", 200, 10, 50, 2) if quick else
                   bench_engines("mnist", "shards", 100, 2, 25, 3))
        print(json.dumps(engines))
        load_after = os.getloadavg()[0]
    finally:
        ray.shutdown()
    args.out.mkdir(parents=True, exist_ok=True)
    large = bench_large(100 if quick else args.large_agents, 2 if quick else args.large_rounds,
                        2, 100, args.out)
    print(json.dumps(large))
    raw = {"machine": machine(), "engines": engines, "large": large,
           "load_average_1min_engines": [load_before, load_after],
           "provenance": started.record()}
    if args.no_write:
        return
    (args.out / "ray.json").write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n")
    write_section("ray", render(raw))


def render(raw: dict[str, Any]) -> str:
    """docs/benchmarks.md's ``ray`` section from the raw numbers (``ray.json``)."""
    e, large = raw["engines"], raw["large"]
    load_before, load_after = raw["load_average_1min_engines"]
    flags = " --quick" if e["dataset"] == "digits" else ""
    if not flags and large["agents"] != 1000:
        flags += f" --large-agents {large['agents']}"
    if not flags and large["rounds"] != 5:
        flags += f" --large-rounds {large['rounds']}"
    cmd = f"`.venv/bin/python -m benchmarks.bench_ray{flags}`"
    rows = [
        f"| {name} | {e['seconds'][name]:.2f} | {e['agent_steps_per_s'][name]:.1f} "
        f"| {e['ratio_to_local'][name]:.2f}× |"
        for name in ("local", "ray x1", "ray x2")
    ]
    x2_x1 = e["seconds"]["ray x1"] / e["seconds"]["ray x2"]
    driver = large["wall_seconds"] - large["train_seconds"]
    lines = [
        "## Simulator engines (`peerd sim --engine local|ray`)",
        "",
        f"Machine: {raw['machine']}; load average {load_before:.0f} before and "
        f"{load_after:.0f} after the engine measurement. Command: {cmd}; raw output `docs/reproduction/ray/ray.json`. What the "
        "engines are: [simulator.md](simulator.md).",
        "",
        f"One round of training, {e['dataset']} / {e['model']} ({e['params']} params), "
        f"N = {e['agents']}, K = {e['steps']}, batch 64, shards of {e['shard_agents']} agents; "
        f"median of {e['repeat']} interleaved repetitions against one local Ray. The three "
        f"engines returned {'the same bytes' if e['identical_bytes'] else 'DIFFERENT bytes'}.",
        "",
        "| engine | s per round | agent-steps/s | vs local |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        "A shard trains on one thread wherever it runs (the floats depend on the thread "
        "count), so the local engine uses one core and Ray can gain at most the cores its "
        f"actors get: ≤ 2× here. Measured, 2 actors ran at {x2_x1:.2f}× 1 actor "
        f"({e['ratio_to_local']['ray x2']:.2f}× local). "
        + (f"With both cores busy (load average ~{load_after:.0f}) a second actor finds no "
           "idle core, so such a run shows Ray's cost, not its scaling. "
           if x2_x1 < 1.3 else
           "What keeps it under 2×: the driver (mobility, merges, blends, evaluation) and "
           "Ray's own processes share the same 2 cores, and each shard's rows go through "
           "the object store every round. ")
        + "Ray's cost with one actor (the rows through the object store, the setup once) "
        f"is small for this model: 1 actor ran at {e['ratio_to_local']['ray x1']:.2f}× local. "
        "On a cluster, expect up to one core's throughput per actor.",
        "",
        f"A 1,000-agent run: `peerd sim --engine ray --workers {large['workers']} --agents "
        f"{large['agents']} --rounds {large['rounds']} --algorithms cached-dfl "
        f"--shard-agents {large['shard_agents']} --partition iid` (digits: its 1,348 training "
        "samples give each agent 1–2, too few for label shards; K = 10, the default 3 km grid): "
        f"{large['wall_seconds']:.0f} s wall for {large['rounds']} rounds "
        f"({large['seconds_per_round']:.0f} s per round), of which training "
        f"{large['train_seconds']:.0f} s ({large['train_agent_steps_per_s']:.0f} agent-steps/s) "
        f"and the driver's share (mobility, {large['cache_merges']} cache merges, blends, "
        f"evaluation) {driver:.0f} s: at N = 1,000 the merges, not training, bound a round. "
        f"Final accuracy {large['final_accuracy_mean']:.3f}, cache "
        f"{large['cache_avg_models']:.1f} models; summary in "
        "`docs/reproduction/ray/large-summary.json`.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
