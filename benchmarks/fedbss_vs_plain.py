"""FedBSS vs plain local training on non-IID MNIST (docs/reproduction.md, "FedBSS vs plain").

Run: ``nice -n 10 .venv/bin/python -m benchmarks.fedbss_vs_plain`` (``--quick`` for a tiny
smoke run that writes to a temporary folder instead of docs/).

Every run is ``peerd sim --dataset mnist --partition shards --algorithms cached-dfl`` with the
settings below, once with ``--local-policy plain`` and once with ``--local-policy fedbss``,
for seeds 0, 1, 2. Both policies take the same number of SGD steps per round (K =
``--local-steps``; FedBSS: ``--fedbss-steps K``, spread over its E epochs) at the same batch
size, so they differ only in *which* samples the steps see. Each run's ``summary.json`` and
``metrics.csv`` go to ``docs/reproduction/fedbss/<policy>-s<seed>/``; the aggregate (mean ±
sample std over seeds of accuracy and of mean local drift, per round) to
``docs/reproduction/fedbss-vs-plain.json`` and a figure beside it. Owns only those outputs.
``--reaggregate`` rebuilds the aggregate from the committed per-run CSVs (runs nothing).

The tables are rendered into docs/reproduction.md by ``benchmarks.reproduce`` (``fedbss-rounds``
and ``fedbss-seeds`` in :data:`TABLES`), and tests/docs re-renders them.
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import _provenance
from benchmarks.reproduce import Outputs
from peerd.sim.output import write_outputs
from peerd.sim.runner import SimConfig, run

OUT = Path("docs/reproduction")
POLICIES = ("plain", "fedbss")
SEEDS = (0, 1, 2)
#: The stem of the full-epoch variant's outputs (``--fedbss-steps 0 --stem fedbss-full``).
FULL = "fedbss-full"


def base_config(agents: int, rounds: int, eval_samples: int, warmup: int,
                model: str = "mlp", fedbss_steps: int = 10) -> SimConfig:
    return SimConfig(dataset="mnist", partition="shards", agents=agents, rounds=rounds,
                     local_steps=10, batch_size=64, lr=0.1, algorithms=("cached-dfl",),
                     capacity=10, tau_max=5.0, eval_samples=eval_samples,
                     fedbss_warmup_rounds=warmup, fedbss_epochs=10, fedbss_steps=fedbss_steps,
                     model=model)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one(cfg: SimConfig, out: Path) -> dict[str, Any]:
    wall, cpu = time.perf_counter(), _cpu()
    result = run(cfg)
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    write_outputs(result, out, plots=False)
    (out / "metrics.json").unlink()  # the CSV holds the same rows; keep the committed files small
    recs = [r for r in result.records if r.algorithm == "cached-dfl"]
    return {"policy": cfg.local_policy, "seed": cfg.seed, "wall_seconds": round(wall, 1),
            "cpu_seconds": round(cpu, 1),
            "rounds": [r.round for r in recs],
            "accuracy": [r.accuracy_mean for r in recs],
            "drift": [r.drift_mean for r in recs]}


def aggregate(runs: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"config": config, "seeds": list(SEEDS), "policies": {},
                           "std": "sample (ddof = 1) over the seeds"}
    for pol in POLICIES:
        mine = [r for r in runs if r["policy"] == pol]
        acc = np.array([r["accuracy"] for r in mine])
        drift = np.array([r["drift"] for r in mine])
        warmup = config["fedbss_warmup_rounds"]
        out["policies"][pol] = {
            "rounds": mine[0]["rounds"],
            # Sample std (ddof = 1): the convention of every table in docs/ (issue 28).
            "accuracy_mean": acc.mean(0).tolist(), "accuracy_std": acc.std(0, ddof=1).tolist(),
            "drift_mean": drift.mean(0).tolist(), "drift_std": drift.std(0, ddof=1).tolist(),
            "final_accuracy": [float(a) for a in acc[:, -1]],
            # Per seed, the mean drift over the curriculum rounds (after the warm-up).
            "curriculum_drift": [float(d[warmup:].mean()) for d in drift],
            "wall_seconds": [r["wall_seconds"] for r in mine],
            "cpu_seconds": [r["cpu_seconds"] for r in mine],
        }
    return out


def runs_from_outputs(out: Path, previous: dict[str, Any],
                      stem: str = "fedbss") -> list[dict[str, Any]]:
    """The runs as :func:`one` returned them, read back from the committed per-run CSVs; the
    wall and CPU seconds (not in the CSVs) from the ``previous`` aggregate."""
    runs = []
    for pol in POLICIES:
        for k, seed in enumerate(SEEDS):
            with (out / stem / f"{pol}-s{seed}" / "metrics.csv").open() as f:
                rows = [r for r in csv.DictReader(f) if r["algorithm"] == "cached-dfl"]
            runs.append({"policy": pol, "seed": seed,
                         "wall_seconds": previous["policies"][pol]["wall_seconds"][k],
                         "cpu_seconds": previous["policies"][pol]["cpu_seconds"][k],
                         "rounds": [int(r["round"]) for r in rows],
                         "accuracy": [float(r["accuracy_mean"]) for r in rows],
                         "drift": [float(r["drift_mean"]) for r in rows]})
    return runs


def plot(agg: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for pol, res in agg["policies"].items():
        xs = res["rounds"]
        for ax, key in ((a1, "accuracy"), (a2, "drift")):
            m, s = np.array(res[f"{key}_mean"]), np.array(res[f"{key}_std"])
            (line,) = ax.plot(xs, m, label=pol)
            ax.fill_between(xs, m - s, m + s, color=line.get_color(), alpha=0.2, linewidth=0)
    warm = agg["config"]["fedbss_warmup_rounds"]
    for ax in (a1, a2):
        ax.axvline(warm + 0.5, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend()
    a1.set_ylabel("test accuracy (mean over agents)")
    a2.set_ylabel("mean local drift ‖w − x̄‖₂")
    fig.suptitle("cached-dfl, MNIST shards: plain vs FedBSS (mean ± sample std, 3 seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _picked_rounds(agg: dict[str, Any]) -> list[int]:
    warm, last = agg["config"]["fedbss_warmup_rounds"], agg["config"]["rounds"]
    return sorted(r for r in {1, warm, warm + 1, warm + 5, *range(25, last + 1, 25), last}
                  if 1 <= r <= last)


def rounds_table(agg: dict[str, Any]) -> str:
    """Accuracy and drift at chosen rounds, mean ± sample std over the seeds."""
    plain, fed = agg["policies"]["plain"], agg["policies"]["fedbss"]
    lines = ["| round | plain accuracy | FedBSS accuracy | plain drift | FedBSS drift |",
             "|---:|---:|---:|---:|---:|"]
    for r in _picked_rounds(agg):
        i = plain["rounds"].index(r)
        cells = [f"{p['accuracy_mean'][i]:.4f} ± {p['accuracy_std'][i]:.4f}"
                 for p in (plain, fed)]
        cells += [f"{p['drift_mean'][i]:.3f} ± {p['drift_std'][i]:.3f}" for p in (plain, fed)]
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    lines += ["", f"(mean ± sample std, n = {len(agg['seeds'])} seeds.)"]
    return "\n".join(lines) + "\n"


def seeds_table(agg: dict[str, Any]) -> str:
    """Per seed: the final accuracy and the mean drift over the curriculum rounds."""
    plain, fed = agg["policies"]["plain"], agg["policies"]["fedbss"]
    lines = ["| seed | plain final acc | FedBSS final acc | plain curriculum-round drift "
             "| FedBSS curriculum-round drift | plain cpu s | FedBSS cpu s |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for k, seed in enumerate(agg["seeds"]):
        lines.append(f"| {seed} | {plain['final_accuracy'][k]:.4f} | "
                     f"{fed['final_accuracy'][k]:.4f} | {plain['curriculum_drift'][k]:.3f} | "
                     f"{fed['curriculum_drift'][k]:.3f} | {plain['cpu_seconds'][k]} | "
                     f"{fed['cpu_seconds'][k]} |")
    return "\n".join(lines) + "\n"


def _committed(stem: str = "fedbss") -> dict[str, Any]:
    return dict(json.loads((OUT / f"{stem}-vs-plain.json").read_text()))


#: docs/reproduction.md's FedBSS tables, from the committed aggregate (the report's Outputs
#: are the Cached-DFL runs under docs/results/ and are not read).
TABLES: dict[str, Callable[[Outputs], str]] = {
    "fedbss-rounds": lambda _o: rounds_table(_committed()),
    "fedbss-seeds": lambda _o: seeds_table(_committed()),
    # The lecture's full E epochs a round (``--fedbss-steps 0``), not step-matched.
    "fedbss-full-rounds": lambda _o: rounds_table(_committed(FULL)),
    "fedbss-full-seeds": lambda _o: seeds_table(_committed(FULL)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--eval-samples", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (processes)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--table", action="store_true",
                    help="print the docs' tables from the committed JSON; run nothing")
    ap.add_argument("--reaggregate", action="store_true",
                    help="rebuild the aggregate JSON from the per-run CSVs there; run nothing")
    ap.add_argument("--fedbss-steps", type=int, default=10,
                    help="FedBSS's SGD steps a round, spread over its epochs (0: the lecture's "
                         "full epochs, as many steps as its admitted samples take)")
    ap.add_argument("--stem", default="fedbss",
                    help="outputs: OUT/STEM/<policy>-s<seed>/ and OUT/STEM-vs-plain.{json,png}")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.table:
        agg = json.loads((args.out / f"{args.stem}-vs-plain.json").read_text())
        print(rounds_table(agg) + "\n" + seeds_table(agg), end="")
        return
    if args.reaggregate:
        path = args.out / f"{args.stem}-vs-plain.json"
        previous = json.loads(path.read_text())
        agg = aggregate(runs_from_outputs(args.out, previous, args.stem), previous["config"])
        if "provenance" in previous:  # the run's record, not this re-aggregation's
            agg["provenance"] = previous["provenance"]
        path.write_text(json.dumps(agg, indent=1) + "\n")
        plot(agg, args.out / f"{args.stem}-vs-plain.png")
        return
    if args.quick:
        args.agents, args.rounds, args.eval_samples, args.warmup = 4, 3, 200, 1
        args.out = Path("/tmp/fedbss-vs-plain")
    started = _provenance.start(ap, args)
    cfg = base_config(args.agents, args.rounds, args.eval_samples, args.warmup,
                      fedbss_steps=args.fedbss_steps)
    todo = [(replace(cfg, local_policy=pol, seed=seed), args.out / args.stem / f"{pol}-s{seed}")
            for seed in SEEDS for pol in POLICIES]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(one, *zip(*todo, strict=True)))
    for r in runs:
        print(f"{r['policy']} seed {r['seed']}: final acc {r['accuracy'][-1]:.4f}, "
              f"wall {r['wall_seconds']} s, cpu {r['cpu_seconds']} s", flush=True)
    agg = aggregate(runs, cfg.to_json())
    agg["provenance"] = started.record()
    (args.out / f"{args.stem}-vs-plain.json").write_text(json.dumps(agg, indent=1) + "\n")
    plot(agg, args.out / f"{args.stem}-vs-plain.png")


if __name__ == "__main__":
    main()
