"""Compact entry encodings in `peerd sim` (issue 27, item 5): accuracy at equal rounds and the
entry bytes the exchanges move per round, against float32.

Each run is one ``peerd sim`` command (cached-dfl only: the encoding is its exchange's); its
summary, its exchange counters (``metrics.json``'s ``info.exchange``: payload bytes per
round, entries moved), the command, commit, machine and date are kept as one JSON file per
run under docs/results/encoding/DATASET/. ``--render`` rewrites docs/benchmarks.md's
``encoding`` section from those files alone (tests/docs/test_encoding_doc.py re-renders it
and diffs).

    nice python -m benchmarks.bench_encoding --dataset digits        # 5 encodings x 3 seeds
    nice python -m benchmarks.bench_encoding --dataset mnist --encodings float32,float16,int8:256
    python -m benchmarks.bench_encoding --render
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks._report import commit, machine, write_section

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "encoding"
SEEDS = (0, 1, 2)
ENCODINGS = ("float32", "float16", "bfloat16", "int8", "int8:256")
#: Per dataset, the run's options besides --seed and --entry-encoding: small enough for a
#: shared 2-core machine (digits: ~30 s a run; MNIST/FashionMNIST with the MLP: minutes).
ARGS: dict[str, tuple[str, ...]] = {
    "digits": ("--dataset", "digits", "--rounds", "30"),
    "mnist": ("--dataset", "mnist", "--model", "mlp", "--rounds", "20", "--eval-every", "5",
              "--eval-samples", "2000"),
    "fashion-mnist": ("--dataset", "fashion-mnist", "--model", "mlp", "--rounds", "20",
                      "--eval-every", "5", "--eval-samples", "2000"),
}
DATASETS = tuple(ARGS)
SECTION = "encoding"


def command(dataset: str, encoding: str, seed: int) -> list[str]:
    args = ["peerd", "sim", *ARGS[dataset], "--algorithms", "cached-dfl"]
    if encoding != "float32":
        args += ["--entry-encoding", encoding]
    if seed:
        args += ["--seed", str(seed)]
    return args


def result_path(dataset: str, encoding: str, seed: int, root: Path = RESULTS) -> Path:
    return root / dataset / f"{encoding.replace(':', '-')}-s{seed}.json"


def run_one(dataset: str, encoding: str, seed: int) -> dict[str, Any]:
    cmd = command(dataset, encoding, seed)
    exe = Path(sys.executable).with_name("peerd")
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run([str(exe), *cmd[1:], "--no-plots", "--json", "--out", out], check=True,
                       stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        summary = json.loads((Path(out) / "summary.json").read_text())
        info = json.loads((Path(out) / "metrics.json").read_text())["info"]
    return {"command": shlex.join(cmd), "commit": commit(), "machine": machine(),
            "date": f"{datetime.now(UTC):%Y-%m-%d}", "wall_seconds": round(wall, 1),
            "summary": summary, "exchange": info["exchange"], "parameters": info["parameters"]}


def _cell(values: list[float], digits: int = 1, sign: str = "") -> str:
    # + 0.0 turns a mean that rounds to -0 into 0 (a "-0.00" would claim a loss).
    mean = round(statistics.fmean(values), digits) + 0.0
    return f"{mean:{sign}.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _load(dataset: str, encoding: str, root: Path) -> list[dict[str, Any]]:
    paths = [result_path(dataset, encoding, s, root) for s in SEEDS]
    return [json.loads(p.read_text()) for p in paths if p.exists()]


#: The issue's goal: at least this many times fewer bytes than float32, per codec ...
GOAL_RATIO = {"float16": 2.0, "bfloat16": 2.0, "int8": 3.5}
#: ... losing at most this many points of accuracy (mean of the per-seed differences).
GOAL_POINTS = 0.5


def table(root: Path = RESULTS) -> str:
    """The section: one row per (dataset, encoding) whose seeds' outputs are all committed."""
    rows = ["| dataset | encoding | final accuracy % | Δ vs float32 (points) | entry payload (B) | "
            "MB moved per round | × fewer bytes | goal |",
            "|---|---|---:|---:|---:|---:|---:|---|"]
    runs_all: list[dict[str, Any]] = []
    for dataset in DATASETS:
        base = _load(dataset, "float32", root)
        if len(base) != len(SEEDS):
            continue
        acc0 = [100 * r["summary"]["results"]["cached-dfl"]["final_accuracy_mean"] for r in base]
        mb0 = [r["summary"]["results"]["cached-dfl"]["bytes_per_round"] / 1e6 for r in base]
        for encoding in ENCODINGS:
            runs = _load(dataset, encoding, root)
            if len(runs) != len(SEEDS):
                continue
            res = [r["summary"]["results"]["cached-dfl"] for r in runs]
            acc = [100 * r["final_accuracy_mean"] for r in res]
            mb = [r["bytes_per_round"] / 1e6 for r in res]
            delta = [a - b for a, b in zip(acc, acc0, strict=True)]  # paired by seed
            sizes = sorted({s for r in runs for s in r["exchange"]["payload_bytes"]})
            ratio = statistics.fmean(mb0) / statistics.fmean(mb)
            goal = "—"
            if encoding != "float32":
                want = GOAL_RATIO[encoding.split(":")[0]]
                met = ratio >= want and statistics.fmean(delta) >= -GOAL_POINTS
                goal = f"{'met' if met else 'missed'} (≥ {want:g}×, ≥ −{GOAL_POINTS:g})"
            rows.append(f"| {dataset} | {encoding} | {_cell(acc)} | "
                        f"{'—' if encoding == 'float32' else _cell(delta, 2, '+')} | "
                        f"{' / '.join(f'{s:,}' for s in sizes)} | {_cell(mb, 2)} | "
                        f"{ratio:.2f} | {goal} |")
            runs_all += runs
    where = sorted({f"{r['machine']}; commit {r['commit']}" for r in runs_all})
    head = ("## Compact entry encodings (issue 27) — `python -m benchmarks.bench_encoding`\n\n"
            "Cached-DFL in `peerd sim` with `--entry-encoding` (the daemon's `[fleet] "
            "entry_encoding`): every published model goes through the wire codec "
            "(`encode_tensors`, the index read back, `decode_tensors`) and peers blend what "
            "they decode; each agent keeps its own float32 model. 100 agents on the default "
            "grid, shards, C = 10, τ_max = 5, K = 10; digits with its MLP for 30 rounds, "
            "MNIST and FashionMNIST with the MLP for 20 rounds (2,000 test samples). Each row: "
            "seeds 0, 1, 2, mean ± sample std, accuracy at the same (last) round. Δ: each "
            "seed's accuracy minus float32's for that seed, then mean ± std. MB moved per "
            "round: entry payload bytes the exchanges moved into caches (a daemon's Want "
            "fetches no others), all agents, averaged over the rounds; the signed head (a few "
            "hundred bytes an entry) is not counted. Which entries move depends on metadata "
            "only, so every encoding moves the same entries and the ratio is the payload's. "
            "Goal (issue 27): ≥ 2× fewer bytes at float16, ≥ 3.5× at int8, ≤ 0.5 points "
            "lost. Accuracy is the mean over agents on the test set (digits: all of it), as in "
            "docs/reproduction.md; these are MLPs at 20–30 rounds, not the paper's CNN.\n\n")
    foot = (f"\nOutputs: docs/results/encoding/DATASET/ENCODING-sSEED.json ({len(runs_all)} runs, "
            "each with its command, commit, machine and date, the summary and the per-round "
            "byte counts). Rendered from them by `python -m benchmarks.bench_encoding "
            "--render`; tests/docs/test_encoding_doc.py re-renders and compares.\n")
    machines = "".join(f"\nMachine: {w}.\n" for w in where)
    return head + "\n".join(rows) + "\n" + foot + machines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", choices=DATASETS)
    ap.add_argument("--encodings", default=",".join(ENCODINGS))
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--render", action="store_true", help="only rewrite the docs section")
    args = ap.parse_args()
    if args.dataset is not None:
        for encoding in args.encodings.split(","):
            for seed in map(int, args.seeds.split(",")):
                doc = run_one(args.dataset, encoding, seed)
                path = result_path(args.dataset, encoding, seed)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
                res = doc["summary"]["results"]["cached-dfl"]
                print(f"{args.dataset} {encoding} s{seed}: acc {res['final_accuracy_mean']:.4f}"
                      f" bytes/round {res['bytes_per_round']:.0f} ({doc['wall_seconds']} s)",
                      flush=True)
    write_section(SECTION, table())


if __name__ == "__main__":
    main()
