"""Poisoned peers against every blend rule on non-IID MNIST (issue 15, item 6).

Run: ``nice -n 10 .venv/bin/python -m benchmarks.robustness --full --workers 2`` (writes one
summary JSON per run under ``docs/robustness/`` and the table between the markers of
``docs/robustness.md``); ``--quick`` is a smoke run on digits into a temporary folder.

The sweep is attack × attacker fraction × blend rule × seed, all Cached-DFL on MNIST shards
(:data:`BASE`), plus every rule without attackers (the weighted one is the reference row).
Runs whose JSON already exists are not run again, so an interrupted sweep resumes; sign-flip
runs first (the issue's criterion is about it). Accuracy is over honest agents only
(:mod:`peerd.sim.attacks`). Each worker process pins torch to one thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import _provenance
from benchmarks._provenance import Started

BASE_OPTIONS: dict[str, Any] = dict(
    dataset="mnist", partition="shards", algorithms=("cached-dfl",), agents=20, rounds=20,
    local_steps=5, batch_size=32, model="linear", eval_samples=2000, eval_every=20)
ATTACKS = ("sign-flip", "gaussian", "label-flip", "alie", "ipm")
FRACTIONS = (0.1, 0.2, 0.3)
RULES = ("weighted", "median", "trimmed", "clipped", "krum")
#: Extra columns for sign-flip only: the defaults' parameters moved towards the threat
#: (f = 2, 3 and β = 0.2 expect two or three bad models in a cache of ~10).
SIGN_FLIP_EXTRA = ("krum:2", "krum:3", "trimmed:0.2")
SEEDS = (0, 1, 2)
MARK_START = "<!-- robustness-table:start -->"
MARK_END = "<!-- robustness-table:end -->"


def grid(attacks: Sequence[str], fractions: Sequence[float], rules: Sequence[str],
         seeds: Sequence[int], extra: Sequence[str],
         other_fractions: Sequence[float] | None = None) -> list[tuple[str, float, str, int]]:
    """(attack, fraction, rule, seed), attack-free runs first, then attack by attack;
    attacks other than sign-flip at ``other_fractions`` (None: all ``fractions``)."""
    cols = list(rules) + [r for r in extra if r not in rules]
    runs = [("none", 0.0, r, s) for r in cols for s in seeds]
    for attack in attacks:
        rs = cols if attack == "sign-flip" else list(rules)
        fs = fractions if attack == "sign-flip" or other_fractions is None else other_fractions
        runs += [(attack, f, r, s) for f in fs for r in rs for s in seeds]
    return runs


def name(attack: str, fraction: float, rule: str, seed: int) -> str:
    return f"{attack}-{round(fraction * 100):02d}-{rule.replace(':', '_')}-s{seed}.json"


def one(job: tuple[str, float, str, int, dict[str, Any], str, Started | None]
        ) -> tuple[str, float]:
    """Run one configuration in this worker; write its summary (with the sweep's provenance
    and this run's wall time); return (file, seconds)."""
    attack, fraction, rule, seed, options, out, started = job
    import torch

    torch.set_num_threads(1)
    from peerd.sim.output import summary_json
    from peerd.sim.runner import SimConfig, run

    cfg = replace(SimConfig(**options), attack=attack, attackers=fraction, blend=rule, seed=seed)
    start = time.perf_counter()
    result = run(cfg)
    seconds = time.perf_counter() - start
    doc = summary_json(result)
    doc["wall_seconds"] = round(seconds, 2)
    if started is not None:
        doc["provenance"] = started.record() | {"wall_s": round(seconds, 1)}
    for curve in (r.pop("curve") for r in doc["results"].values()):
        doc.setdefault("final_round", curve[-1][0] if curve else None)
    path = Path(out) / name(attack, fraction, rule, seed)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path.name, seconds


def table(out: Path, attacks: Sequence[str], fractions: Sequence[float], rules: Sequence[str],
          seeds: Sequence[int], extra: Sequence[str]) -> str:
    """Markdown: rows attack × fraction, columns rules; final accuracy % mean ± sample std
    over the seeds (n given where a cell has fewer runs than seeds)."""
    cols = list(rules) + [r for r in extra if r not in rules]

    def cell(attack: str, fraction: float, rule: str) -> str:
        accs = []
        for s in seeds:
            path = out / name(attack, fraction, rule, s)
            if path.exists():
                res = json.loads(path.read_text())["results"]["cached-dfl"]
                accs.append(100 * res["final_accuracy_mean"])
        if not accs:
            return "—"
        # Sample std (ddof = 1), the convention of every table in docs/ (issue 28).
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        note = "" if len(accs) == len(seeds) else f" (n={len(accs)})"
        return f"{statistics.fmean(accs):.1f} ± {sd:.1f}{note}"

    found = sorted(out.glob("*.json"))
    lines = ["| attack | attackers | " + " | ".join(cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    lines.append("| none (reference) | 0 % | " + " | ".join(cell("none", 0.0, r) for r in cols)
                 + " |")
    for attack in attacks:
        for f in fractions:
            row = [cell(attack, f, r) if (attack == "sign-flip" or r in rules) else "·"
                   for r in cols]
            if all(c in ("—", "·") for c in row):
                continue  # not in this (reduced) grid
            lines.append(f"| {attack} | {round(f * 100)} % | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n\n" + provenance([json.loads(p.read_text()) for p in found])


def provenance(docs: Sequence[dict[str, Any]]) -> str:
    """Markdown lines: per invocation of the sweep that ran these runs (its commit, command
    and machine), how many runs and their own wall times; runs that recorded none, counted."""
    groups: dict[tuple[str, bool, str], list[dict[str, Any]]] = {}
    bare = 0
    for doc in docs:
        rec = doc.get("provenance")
        if rec is None:
            bare += 1
            continue
        groups.setdefault((rec["commit"], rec["dirty"], rec["command_line"]), []).append(doc)
    out = []
    for (commit, dirty, command), runs in groups.items():
        rec, walls = runs[0]["provenance"], [r["wall_seconds"] for r in runs]
        m = rec["machine"]
        out.append(
            f"Provenance: {len(runs)} runs, commit `{commit[:12]}` "
            f"({'dirty' if dirty else 'clean'}), `{command}`; {m['cpu']}, {m['cores']} "
            f"cores, torch {m['torch_threads']} thread(s) a worker; started {rec['date']}. "
            f"The runs' own wall times: {sum(walls):,.0f} s in all, "
            f"{min(walls):.1f}–{max(walls):.1f} s, median {statistics.median(walls):.1f} s.")
    if bare:
        out.append(f"{bare} runs record no provenance (measured before the sweep wrote it).")
    return "\n\n".join(out) + "\n"


def write_table(doc: Path, text: str) -> None:
    """Replace what lies between the markers in ``doc`` (left alone if it has none)."""
    if not doc.exists():
        return
    body = doc.read_text()
    if MARK_START not in body or MARK_END not in body:
        return
    head, _, rest = body.partition(MARK_START)
    _, _, tail = rest.partition(MARK_END)
    doc.write_text(f"{head}{MARK_START}\n{text}{MARK_END}{tail}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--full", action="store_true", help="the documented sweep")
    mode.add_argument("--quick", action="store_true", help="a smoke run on digits")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--attacks", default=",".join(ATTACKS))
    ap.add_argument("--other-fractions", default="",
                    help="attacker fractions for the attacks other than sign-flip, comma "
                         "separated (default: all of 0.1, 0.2, 0.3); a smaller grid")
    ap.add_argument("--table-only", action="store_true",
                    help="run nothing: rebuild the table from the JSON files there")
    ap.add_argument("--out", type=Path, default=Path("docs/robustness"))
    ap.add_argument("--doc", type=Path, default=Path("docs/robustness.md"))
    args = ap.parse_args(argv)
    attacks = tuple(a for a in args.attacks.split(",") if a)
    options = dict(BASE_OPTIONS)
    fractions: tuple[float, ...] = FRACTIONS
    rules: tuple[str, ...] = RULES
    seeds: tuple[int, ...] = SEEDS
    extra: tuple[str, ...] = SIGN_FLIP_EXTRA
    out, doc = args.out, args.doc
    if args.quick:
        options.update(dataset="digits", agents=10, rounds=3, eval_every=3, eval_samples=0)
        attacks, fractions, rules, seeds, extra = ("sign-flip",), (0.2,), ("weighted",
                                                                          "clipped"), (0,), ()
        out, doc = Path(tempfile.mkdtemp(prefix="robustness-")), Path("/nonexistent")
    others = tuple(float(f) for f in args.other_fractions.split(",") if f) or None
    out.mkdir(parents=True, exist_ok=True)
    started = _provenance.start(ap, args)
    todo = [(a, f, r, s, options, str(out), started)
            for a, f, r, s in grid(attacks, fractions, rules, seeds, extra, others)
            if not (out / name(a, f, r, s)).exists() and not args.table_only]
    print(f"{len(todo)} runs to go into {out}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        for i, (file, seconds) in enumerate(pool.map(one, todo), 1):
            print(f"[{i}/{len(todo)}] {file} {seconds:.1f} s", file=sys.stderr, flush=True)
    print(f"sweep wall time {time.perf_counter() - start:.0f} s", file=sys.stderr)
    text = table(out, attacks, fractions, rules, seeds, extra)
    write_table(doc, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
