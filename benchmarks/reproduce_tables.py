"""The experiments behind docs/reproduction.md's Cached-DFL tables, and those tables (with
the FedCache tables of :mod:`benchmarks.reproduce_fedcache`, rendered from their own outputs).

:data:`EXPERIMENTS` lists every run (a :class:`~peerd.sim.runner.SimConfig` each);
:data:`TABLES` renders each marked table of the report from the runs' committed outputs
(:class:`benchmarks.reproduce.Outputs`) and from nothing else, so that a test can re-render
them and compare. The paper's Table 2 values live here too (:data:`PAPER_TABLE2`), the only
numbers in the tables that do not come from a run. Owns no files; the driver is
:mod:`benchmarks.reproduce`.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from benchmarks import (
    fedbss_vs_plain,
    reproduce_fedcache,
    reproduce_fedcache_converged,
    reproduce_fedcvt,
    table2_loro,
    table2_oos_render,
)
from benchmarks.reproduce import Experiment, MissingOutputsError, Outputs, Run, RunOutput
from peerd.sim.runner import SimConfig

SEEDS = (0, 1, 2)

#: The paper-calibrated grid: 74 × 74 intersections 50 m apart (blocks per side, metres).
PAPER_BLOCKS, PAPER_BLOCK_LENGTH = 73, 50.0

#: Paper Table 2 (Wang et al., "Decentralized Federated Learning with Model Caching on Mobile
#: Agents", AAAI 2025): (epoch seconds, the paper's τ_max) -> (average number of cached
#: models, their average age in epochs), as printed (one decimal).
PAPER_TABLE2: dict[tuple[int, int], tuple[float, float]] = {
    **{(30, t): v for t, v in zip((1, 2, 3, 4, 5, 10, 20), (
        (0.9, 0.0), (1.7, 0.5), (2.7, 1.0), (3.9, 1.6), (5.2, 2.2), (14.9, 5.4), (44.8, 11.6)),
        strict=True)},
    **{(60, t): v for t, v in zip((1, 2, 3, 4, 5, 10, 20), (
        (1.7, 0.0), (3.8, 0.6), (6.5, 1.2), (10.4, 1.8), (14.1, 2.4), (43.1, 5.6), (90.3, 9.8)),
        strict=True)},
    **{(120, t): v for t, v in zip((1, 2, 3, 4, 5, 10, 20), (
        (3.7, 0.0), (9.9, 0.6), (18.5, 1.3), (31.4, 1.9), (35.2, 1.5), (90.2, 4.7), (98.5, 5.2)),
        strict=True)},
}

SMOKE = SimConfig(dataset="digits", partition="shards", agents=20, rounds=15, local_steps=5,
                  batch_size=32, algorithms=("cached-dfl", "dfl", "isolated"), blocks=5,
                  block_length=200.0, round_seconds=60, eval_every=15)

MIXED = SimConfig(dataset="breast_cancer", mixed_schema=True, partition="iid", agents=30,
                  rounds=30, local_steps=5, batch_size=16,
                  algorithms=("cached-dfl", "isolated", "fedavg"))

#: Cache statistics only: training does not change them, so the cheapest model and step.
TABLE2_BASE = SimConfig(dataset="digits", model="linear", partition="shards", agents=100,
                        rounds=50, capacity=100, local_steps=1, batch_size=8,
                        algorithms=("cached-dfl",), eval_every=50, eval_samples=100,
                        stats_from=21, blocks=PAPER_BLOCKS,
                        block_length=PAPER_BLOCK_LENGTH)
TABLE2_ROUNDS = (30, 60, 120)
TABLE2_TAUS = (1, 2, 3, 4, 5, 10, 20)  # the paper's τ_max; peerd's is one less

MNIST = SimConfig(dataset="mnist", model="mlp", partition="shards", agents=100, rounds=40,
                  capacity=10, tau_max=5.0, local_steps=10, eval_every=5, eval_samples=2000)
MNIST_25 = replace(MNIST, rounds=25, algorithms=("cached-dfl",))
#: Accuracy on the paper-calibrated grid: unlimited cache, so τ_max is the only cutoff.
PAPER_MNIST = replace(MNIST_25, rounds=30, capacity=100, blocks=PAPER_BLOCKS,
                      block_length=PAPER_BLOCK_LENGTH)
PAPER_TAUS = (1, 5, 20)
RHOS = (0.01, 0.1)


def _paper_tau(tau: int) -> float:
    # The paper drops an entry at t − τ ≥ τ_max, peerd (the lecture) at t − τ > τ_max.
    return float(tau - 1)


EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment("smoke", "quick", tuple(Run(f"s{s}", replace(SMOKE, seed=s)) for s in SEEDS)),
    Experiment("table2", "quick", tuple(
        Run(f"rs{rs}-tau{tau}", replace(TABLE2_BASE, round_seconds=rs, tau_max=_paper_tau(tau)))
        for rs in TABLE2_ROUNDS for tau in TABLE2_TAUS)),
    Experiment("mixed-schema", "quick", tuple(Run(f"s{s}", replace(MIXED, seed=s)) for s in SEEDS)),
    Experiment("tau-paper-grid", "full", tuple(
        Run(f"tau{tau}-s{s}", replace(PAPER_MNIST, tau_max=_paper_tau(tau), seed=s))
        for tau in PAPER_TAUS for s in SEEDS)),
    Experiment("tau-paper-grid-long", "full", tuple(
        Run(f"tau{tau}-s{s}", replace(PAPER_MNIST, rounds=60, eval_every=10,
                                      tau_max=_paper_tau(tau), seed=s))
        for tau in PAPER_TAUS[1:] for s in SEEDS)),
    Experiment("rho", "full", tuple(
        Run(f"rho{rho:g}-s{s}", replace(PAPER_MNIST, tau_max=_paper_tau(5), rho=rho, seed=s))
        for rho in RHOS for s in SEEDS)),
    Experiment("mnist", "full", (Run("s0", MNIST),)),
    Experiment("mnist-seeds", "full", tuple(
        Run(f"s{s}", replace(MNIST, seed=s)) for s in SEEDS[1:])),
    Experiment("fmnist", "full", (Run("s0", replace(MNIST, dataset="fashion-mnist")),)),
    Experiment("fmnist-seeds", "full", tuple(
        Run(f"s{s}", replace(MNIST, dataset="fashion-mnist", seed=s)) for s in SEEDS[1:])),
    Experiment("cnn", "full", (Run("s0", replace(
        MNIST, model="cnn", rounds=3, algorithms=("cached-dfl",), eval_every=3,
        eval_samples=1000, batched=False)),)),
    Experiment("cache-size", "full", tuple(
        Run(f"c{c}", replace(MNIST_25, capacity=c)) for c in (1, 3, 30))),
    Experiment("cache-size-seeds", "full", tuple(
        Run(f"c{c}-s{s}", replace(MNIST_25, capacity=c, seed=s))
        for c in (1, 3, 30) for s in SEEDS[1:])),
    Experiment("iid", "full", (Run("s0", replace(MNIST, rounds=25, partition="iid")),)),
    Experiment("tau-30s", "full", tuple(
        Run(f"tau{t}", replace(MNIST_25, tau_max=float(t), round_seconds=30))
        for t in (1, 2, 5, 10))),
    Experiment("tau-30s-seeds", "full", tuple(
        Run(f"tau{t}-s{s}", replace(MNIST_25, tau_max=float(t), round_seconds=30, seed=s))
        for t in (1, 2, 5, 10) for s in SEEDS[1:])),
)


# ---- rendering helpers -------------------------------------------------------------------

def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = [_row(header), _row(["---"] * len(header))]
    lines += [_row(r) for r in rows]
    return "\n".join(lines) + "\n"


def _f(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def _pm(values: Sequence[float], digits: int = 3) -> str:
    """Mean ± sample std over seeds (just the value for one seed)."""
    if len(values) == 1:
        return _f(values[0], digits)
    return f"{_f(statistics.mean(values), digits)} ± {_f(statistics.stdev(values), digits)}"


def _span(values: Sequence[float], digits: int = 2) -> str:
    """min–max, or the one value when they print the same."""
    lo, hi = _f(min(values), digits), _f(max(values), digits)
    return lo if lo == hi else f"{lo}–{hi}"


def _walls(runs: Sequence[RunOutput]) -> str:
    walls = [float(r.meta["wall_seconds"]) for r in runs]
    lo, hi = min(walls), max(walls)
    each = f"{lo:.0f} s" if round(lo) == round(hi) else f"{lo:.0f}–{hi:.0f} s"
    return f"{each} per run ({len(walls)} run{'s' if len(walls) > 1 else ''}, " \
           f"{sum(walls) / 60:.1f} min in all; `run.json`'s `wall_seconds`)"


def _final_round(out: RunOutput) -> int:
    return int(out.summary["config"]["rounds"])


def _cache(out: RunOutput, first: int = 1, last: int | None = None) -> tuple[float, float]:
    last = _final_round(out) if last is None else last
    return (out.column_mean("cached-dfl", "cache_avg_models", first, last),
            out.column_mean("cached-dfl", "cache_avg_age", first, last))


# ---- tables --------------------------------------------------------------------------------

def smoke(o: Outputs) -> str:
    runs = [o.run("smoke", f"s{s}") for s in SEEDS]
    rows, below = [], []
    for s, out in zip(SEEDS, runs, strict=True):
        acc = {a: out.accuracy(a, _final_round(out)) for a in ("cached-dfl", "dfl", "isolated")}
        rows.append([s, _f(acc["cached-dfl"]), _f(acc["dfl"]), _f(acc["isolated"])])
        if acc["cached-dfl"] < acc["dfl"]:
            below.append(f"{s} (by {acc['dfl'] - acc['cached-dfl']:.3f})")
    text = _table(["seed", "cached-dfl", "dfl", "isolated"], rows)
    text += "\nCached-DFL is below DFL in seed(s) " + ", ".join(below) + "." if below else \
        "\nCached-DFL is above DFL in every seed."
    return text + f" Wall time: {_walls(runs)}.\n"


def mixed_schema(o: Outputs) -> str:
    runs = [o.run("mixed-schema", f"s{s}") for s in SEEDS]
    rows = []
    for s, out in zip(SEEDS, runs, strict=True):
        t = _final_round(out)
        rows.append([s, *[f"{_f(out.accuracy(a, t), 4)} ± {_f(out.std(a, t), 4)}"
                          for a in ("cached-dfl", "isolated")],
                     _f(out.accuracy("fedavg", t), 4)])
    caches = [_cache(r) for r in runs]
    return _table(["seed", "cached-dfl (mean ± std over agents)", "isolated", "fedavg"], rows) \
        + (f"\nCache: {min(c[0] for c in caches):.1f}–{max(c[0] for c in caches):.1f} models, "
           f"age {min(c[1] for c in caches):.2f}–{max(c[1] for c in caches):.2f} rounds "
           f"(averages over all rounds). Wall time: {_walls(runs)}.\n")


def table2(o: Outputs) -> str:
    rows, errs = [], []
    runs = []
    for rs in TABLE2_ROUNDS:
        for tau in TABLE2_TAUS:
            out = o.run("table2", f"rs{rs}-tau{tau}")
            runs.append(out)
            res = out.result("cached-dfl")
            models, age = float(res["cache_avg_models"]), float(res["cache_avg_age"])
            contacts = out.column_mean("cached-dfl", "contacts", TABLE2_BASE.stats_from,
                                       _final_round(out))
            cells: list[object] = [rs, tau, f"{tau - 1}", _f(models, 2), _f(age, 2),
                                   f"{contacts:.0f}"]
            paper = PAPER_TABLE2.get((rs, tau))
            if paper is None:
                cells += ["n/a", "n/a", "n/a", "n/a"]
            else:
                m_err = (models - paper[0]) / paper[0] * 100
                a_err = age - paper[1]
                errs.append((abs(m_err) <= 20, abs(a_err) <= 0.3))
                cells += [_f(paper[0], 2), _f(paper[1], 2), f"{m_err:+.0f} %", f"{a_err:+.2f}"]
            rows.append(cells)
    text = _table(["round (s)", "τ_max (paper)", "--tau-max", "avg cached models",
                   "avg age (rounds)", "contact pairs / round", "paper models", "paper age",
                   "error, models", "error, age"], rows)
    if errs:
        ok_m = sum(m for m, _ in errs)
        ok_a = sum(a for _, a in errs)
        text += (f"\nWithin 20 % of the paper's model count in {ok_m} of {len(errs)} cells; "
                 f"within 0.3 rounds of its age in {ok_a} of {len(errs)}.")
    return text + f"\nWall time: {_walls(runs)}.\n"


def _seed_curves(o: Outputs, experiment: str, names: Sequence[str],
                 rounds: Sequence[int]) -> list[list[float]]:
    """Per evaluated round, the accuracy of each named run (seed)."""
    runs = [o.run(experiment, n) for n in names]
    return [[r.accuracy("cached-dfl", t) for r in runs] for t in rounds]


def _order(acc: dict[int, float]) -> str:
    """τ_max values from the most to the least accurate; equal as printed (3 decimals): =."""
    ranked = sorted(acc, key=lambda t: (-round(acc[t], 3), t))
    text = f"τ_max {ranked[0]}"
    for prev, t in itertools.pairwise(ranked):
        text += f" {'=' if round(acc[prev], 3) == round(acc[t], 3) else '>'} τ_max {t}"
    return text


def tau_paper_grid(o: Outputs) -> str:
    rounds = (5, 10, 15, 20, 25, 30)
    rows, finals, earlies = [], {}, {}
    runs: list[RunOutput] = []
    for tau in PAPER_TAUS:
        names = [f"tau{tau}-s{s}" for s in SEEDS]
        outs = [o.run("tau-paper-grid", n) for n in names]
        runs += outs
        curves = _seed_curves(o, "tau-paper-grid", names, rounds)
        stds = [r.std("cached-dfl", 30) for r in outs]
        caches = [_cache(r, 11) for r in outs]
        finals[tau], earlies[tau] = statistics.mean(curves[-1]), statistics.mean(curves[0])
        rows.append([tau, f"{tau - 1}", *[_pm(c) for c in curves], _f(statistics.mean(stds)),
                     _f(statistics.mean(c[0] for c in caches), 1),
                     _f(statistics.mean(c[1] for c in caches), 2)])
    text = _table(["τ_max (paper)", "--tau-max", *[f"round {t}" for t in rounds],
                   "std over agents @30", "avg cached (rounds 11–30)", "avg age"], rows)
    text += (f"\nOrder at round 5: {_order(earlies)}; at round 30: {_order(finals)} "
             f"(means over seeds {', '.join(map(str, SEEDS))}). Wall time: {_walls(runs)}.\n")
    return text


def tau_paper_grid_long(o: Outputs) -> str:
    rounds = (10, 20, 30, 40, 50, 60)
    rows = []
    runs: list[RunOutput] = []
    finals = {}
    for tau in PAPER_TAUS[1:]:
        names = [f"tau{tau}-s{s}" for s in SEEDS]
        runs += [o.run("tau-paper-grid-long", n) for n in names]
        curves = _seed_curves(o, "tau-paper-grid-long", names, rounds)
        finals[tau] = statistics.mean(curves[-1])
        rows.append([tau, f"{tau - 1}", *[_pm(c) for c in curves],
                     " / ".join(_f(a) for a in curves[-1])])
    return _table(["τ_max (paper)", "--tau-max", *[f"round {t}" for t in rounds],
                   "round 60, seeds 0 / 1 / 2"], rows) + \
        f"\nOrder at round 60: {_order(finals)}. Wall time: {_walls(runs)}.\n"


def rho(o: Outputs) -> str:
    rounds = (5, 10, 20, 30)
    rows = []
    runs: list[RunOutput] = []
    for value in (0.0, *RHOS):
        if value == 0.0:
            names, exp = [f"tau5-s{s}" for s in SEEDS], "tau-paper-grid"
        else:
            names, exp = [f"rho{value:g}-s{s}" for s in SEEDS], "rho"
            runs += [o.run(exp, n) for n in names]
        curves = _seed_curves(o, exp, names, rounds)
        drift = [float(o.run(exp, n).result("cached-dfl")["drift_mean"]) for n in names]
        rows.append([f"{value:g}", *[_pm(c) for c in curves],
                     " / ".join(_f(a) for a in curves[-1]), _f(statistics.mean(drift))])
    text = _table(["ρ", *[f"round {t}" for t in rounds], "round 30, seeds 0 / 1 / 2",
                   "local drift ‖w − x̄‖ (mean)"], rows)
    return text + f"\n(ρ = 0 is the τ_max = 5 run of the table above.) Wall time: {_walls(runs)}.\n"


def _algs_at(out: RunOutput, t: int, final: bool) -> list[str]:
    cells = []
    for a in ("cached-dfl", "dfl", "fedavg"):
        cell = _f(out.accuracy(a, t))
        if final:
            cell += f" ± {_f(out.std(a, t))}"
        cells.append(cell)
    return cells


def mnist_seed0(o: Outputs) -> str:
    rows = []
    runs = [o.run("mnist", "s0"), o.run("fmnist", "s0")]
    for label, out in zip(("MNIST", "FashionMNIST"), runs, strict=True):
        for t in (5, 10, 20, 30, 40):
            rows.append([label, f"{t} (final)" if t == 40 else t, *_algs_at(out, t, t == 40)])
    return _table(["data", "round", "cached-dfl", "dfl", "fedavg"], rows) + \
        f"\nWall time: {_walls(runs)}.\n"


def mnist_seeds(o: Outputs) -> str:
    rows = []
    labelled = [(f"MNIST, {s}", o.run("mnist-seeds", f"s{s}")) for s in SEEDS[1:]]
    labelled += [(f"FashionMNIST, {s}", o.run("fmnist-seeds", f"s{s}")) for s in SEEDS[1:]]
    runs = [out for _, out in labelled]
    for label, out in labelled:
        cells = []
        for a in ("cached-dfl", "dfl", "fedavg"):
            curve = " / ".join(_f(out.accuracy(a, t)) for t in (5, 10, 20, 30))
            cells.append(f"{curve} / {_f(out.accuracy(a, 40))} ± {_f(out.std(a, 40))}")
        rows.append([label, *cells])
    return _table(["data, seed", "cached-dfl", "dfl", "fedavg"], rows) + \
        f"\nWall time: {_walls(runs)}.\n"


def mnist_claims(o: Outputs) -> str:
    """The claims the text makes about these runs, computed."""
    wanted = [("MNIST", 0, "mnist", "s0")] + \
        [("MNIST", s, "mnist-seeds", f"s{s}") for s in SEEDS[1:]] + \
        [("FashionMNIST", 0, "fmnist", "s0")] + \
        [("FashionMNIST", s, "fmnist-seeds", f"s{s}") for s in SEEDS[1:]]
    runs = []
    for label, seed, experiment, name in wanted[1:]:  # the runs that exist; seed 0 must
        try:
            runs.append((label, seed, o.run(experiment, name)))
        except MissingOutputsError:
            continue
    runs.insert(0, ("MNIST", 0, o.run("mnist", "s0")))
    held, ratios = [], []
    for label, s, out in runs:
        evaluated = [t for t, _ in out.result("fedavg")["curve"]]
        ok = all(out.accuracy("fedavg", t) >= out.accuracy("cached-dfl", t)
                 > out.accuracy("dfl", t) for t in evaluated)
        held.append(f"{label} seed {s}: {'yes' if ok else 'NO'}")
        ratios.append(out.std("dfl", 40) / out.std("cached-dfl", 40))
    caches = [_cache(out) for _, _, out in runs]
    return ("FedAvg ≥ Cached-DFL > DFL at every evaluated round: " + "; ".join(held) + ".\n"
            f"DFL's spread over agents at round 40 is {_span(ratios, 1)}× "
            f"Cached-DFL's (std over agents, these {len(runs)} runs).\n"
            f"Cached-DFL's caches (C = 10) hold {_span([c[0] for c in caches])} models of "
            f"average age {_span([c[1] for c in caches])} rounds (all 40 rounds).\n")


def cnn(o: Outputs) -> str:
    out = o.run("cnn", "s0")
    models, age = _cache(out)
    t = _final_round(out)
    rows = [["cached-dfl", t, _f(out.accuracy("cached-dfl", t)), _f(out.std("cached-dfl", t)),
             _f(models, 2), _f(age, 2), f"{float(out.meta['wall_seconds']) / 60:.1f} min",
             f"{float(out.meta['cpu_seconds']) / 60:.1f} min"]]
    return _table(["algorithm", "rounds", "accuracy", "std over agents", "avg cached",
                   "avg age", "wall time", "CPU time (one thread)"], rows)


def cache_size(o: Outputs) -> str:
    rounds = (5, 10, 15, 20, 25)
    rows = []
    runs = [o.run("cache-size", f"c{c}") for c in (1, 3, 30)]
    base = o.run("mnist", "s0")
    for c, out in ((1, runs[0]), (3, runs[1]), (10, base), (30, runs[2])):
        models, age = _cache(out, 1, 25)
        rows.append([c, *[_f(out.accuracy("cached-dfl", t)) for t in rounds],
                     _f(out.std("cached-dfl", 25)), _f(models, 2), _f(age, 2)])
    return _table(["C", *[f"round {t}" for t in rounds], "std over agents @25",
                   "avg cached", "avg age"], rows) + \
        f"\n(C = 10: the seed-0 MNIST run above, rounds 1–25.) Wall time: {_walls(runs)}.\n"


def cache_size_seeds(o: Outputs) -> str:
    rows = []
    runs: list[RunOutput] = []
    for c in (1, 3, 10, 30):
        if c == 10:  # the three-algorithm runs: the same cached-dfl runs to round 25
            outs = [o.run("mnist", "s0")] + [o.run("mnist-seeds", f"s{s}") for s in SEEDS[1:]]
        else:
            outs = [o.run("cache-size", f"c{c}")]
            outs += [o.run("cache-size-seeds", f"c{c}-s{s}") for s in SEEDS[1:]]
            runs += outs[1:]
        rows.append([c, *[_f(r.accuracy("cached-dfl", 25)) for r in outs],
                     " / ".join(_f(r.std("cached-dfl", 25)) for r in outs)])
    return _table(["C", *[f"seed {s}" for s in SEEDS], "std over agents @25, seeds 0 / 1 / 2"],
                  rows) + f"\nWall time (seeds 1, 2): {_walls(runs)}.\n"


def iid(o: Outputs) -> str:
    out, shards = o.run("iid", "s0"), o.run("mnist", "s0")
    rows = []
    for label, run_ in (("iid", out), ("shards", shards)):
        acc = {a: run_.accuracy(a, 25) for a in ("cached-dfl", "dfl", "fedavg")}
        rows.append([label, f"{_f(acc['cached-dfl'])} ± {_f(run_.std('cached-dfl', 25))}",
                     f"{_f(acc['dfl'])} ± {_f(run_.std('dfl', 25))}", _f(acc["fedavg"]),
                     _f(acc["fedavg"] - acc["dfl"])])
    return _table(["partition", "cached-dfl @25", "dfl @25", "fedavg @25", "fedavg − dfl"],
                  rows) + f"\n(shards: the seed-0 MNIST run at round 25.) Wall time: {_walls([out])}.\n"


def tau_30s(o: Outputs) -> str:
    rounds = (5, 10, 15, 20, 25)
    rows = []
    runs = [o.run("tau-30s", f"tau{t}") for t in (1, 2, 5, 10)]
    for t, out in zip((1, 2, 5, 10), runs, strict=True):
        models, age = _cache(out)
        rows.append([t, *[_f(out.accuracy("cached-dfl", r)) for r in rounds],
                     _f(out.std("cached-dfl", 25)), _f(models, 2), _f(age, 2)])
    return _table(["--tau-max", *[f"round {t}" for t in rounds], "std @25", "avg cached",
                   "avg age"], rows) + f"\nWall time: {_walls(runs)}.\n"


def tau_30s_seeds(o: Outputs) -> str:
    rows = []
    runs: list[RunOutput] = []
    for t in (1, 2, 5, 10):
        outs = [o.run("tau-30s", f"tau{t}")]
        outs += [o.run("tau-30s-seeds", f"tau{t}-s{s}") for s in SEEDS[1:]]
        runs += outs[1:]
        rows.append([t, *[_f(r.accuracy("cached-dfl", 25)) for r in outs],
                     " / ".join(_f(r.std("cached-dfl", 25)) for r in outs)])
    return _table(["--tau-max", *[f"seed {s}" for s in SEEDS],
                   "std over agents @25, seeds 0 / 1 / 2"], rows) + \
        f"\nWall time (seeds 1, 2): {_walls(runs)}.\n"


TABLES: dict[str, Callable[[Outputs], str]] = {
    "smoke": smoke,
    "mixed-schema": mixed_schema,
    "table2": table2,
    "tau-paper-grid": tau_paper_grid,
    "tau-paper-grid-long": tau_paper_grid_long,
    "rho": rho,
    "mnist-seed0": mnist_seed0,
    "mnist-seeds": mnist_seeds,
    "mnist-claims": mnist_claims,
    "cnn": cnn,
    "cache-size": cache_size,
    "cache-size-seeds": cache_size_seeds,
    "iid": iid,
    "tau-30s": tau_30s,
    "tau-30s-seeds": tau_30s_seeds,
    **reproduce_fedcache.TABLES,  # from docs/reproduction/'s committed FedCache JSONs
    **reproduce_fedcache_converged.TABLES,  # from docs/reproduction/fedcache-converged/
    **fedbss_vs_plain.TABLES,  # from docs/reproduction/fedbss-vs-plain.json
    **reproduce_fedcvt.TABLES,  # from docs/reproduction/fedcvt-*.json
    **table2_oos_render.TABLES,  # from docs/reproduction/table2-oos.json
    **table2_loro.TABLES,  # from docs/reproduction/table2-oos{,-cal30,-cal120}.json
}


def configs() -> dict[str, Any]:
    """Every run's command, by experiment/run (for the report's command lists)."""
    from benchmarks.reproduce import command

    return {f"{e.name}/{r.name}": command(r.config) for e in EXPERIMENTS for r in e.runs}
