"""`peerd sim cordial`: the cordial-learning reproductions and their output files.

Owns the experiment settings (validated before any work), the loop over configurations and
the files written into the output folder: ``cordial-<experiment>.json`` (the summary),
``cordial-<experiment>.csv`` (small: median curves or per-run results) and
``cordial-<experiment>.png``. The linear model is :mod:`peerd.sim.cordial_linear`'s, the
composite-MNIST agents :mod:`peerd.sim.cordial_mnist`'s; the algorithm is
:mod:`peerd.core.cordial`'s. matplotlib is imported only to plot.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from peerd.sim.cordial_linear import DISTRIBUTIONS, LinearCurves, run_linear, summarise

EXPERIMENTS = ("linear", "pairwise10")
DEFAULT_AGENTS = {"linear": (8, 16, 32), "pairwise10": (2, 4, 6)}
#: Bounds that keep a typo from allocating gigabytes: the linear state is O(runs·N²·B).
MAX_RUNS, MAX_LINEAR_AGENTS, MAX_ITERATIONS, MAX_PAIRWISE_AGENTS = 10_000, 256, 10**7, 12
#: (configuration label, steps done) -> None.
Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class CordialConfig:
    experiment: str = "linear"
    agents: tuple[int, ...] = ()
    distributions: tuple[str, ...] = DISTRIBUTIONS
    runs: int = 100
    iterations: int = 20_000
    seed: int = 0
    # pairwise10
    images_per_digit: int = 25
    epochs: int = 300
    seeds: int = 3
    methods: tuple[str, ...] = ("isolated", "cordial")

    def resolved_agents(self) -> tuple[int, ...]:
        return self.agents or DEFAULT_AGENTS.get(self.experiment, ())

    def validate(self) -> None:
        """One clear message for the first bad option (the CLI turns it into exit 2)."""
        if self.experiment not in EXPERIMENTS:
            raise ValueError(f"--experiment must be one of {', '.join(EXPERIMENTS)}, "
                             f"not {self.experiment!r}")
        agents = self.resolved_agents()
        if self.experiment == "linear":
            if any(n < 2 or n > MAX_LINEAR_AGENTS for n in agents):
                raise ValueError(f"--agents: each N must be in 2..{MAX_LINEAR_AGENTS}")
            bad = [d for d in self.distributions if d not in DISTRIBUTIONS]
            if bad or not self.distributions:
                raise ValueError(f"--distributions: comma list of {', '.join(DISTRIBUTIONS)}")
            if not 1 <= self.runs <= MAX_RUNS:
                raise ValueError(f"--runs must be in 1..{MAX_RUNS}")
            if not 1 <= self.iterations <= MAX_ITERATIONS:
                raise ValueError(f"--iterations must be in 1..{MAX_ITERATIONS}")
        else:
            if any(n % 2 or n < 2 or n > MAX_PAIRWISE_AGENTS for n in agents):
                raise ValueError("--agents: Pairwise-10 needs an even N in "
                                 f"2..{MAX_PAIRWISE_AGENTS}")
            if not 1 <= self.images_per_digit <= 2000:
                raise ValueError("--images-per-digit must be in 1..2000")
            if not 1 <= self.epochs <= 100_000 or not 1 <= self.seeds <= 100:
                raise ValueError("--epochs must be in 1..100000 and --seeds in 1..100")
            bad = [m for m in self.methods if m not in ("isolated", "cordial")]
            if bad or not self.methods:
                raise ValueError("--methods: comma list of isolated, cordial")
        if not agents:
            raise ValueError("--agents: give at least one N")


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{what}: comma list of integers, not {text!r}") from None


def run_cordial(cfg: CordialConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Run the experiment; returns the summary (with the raw results under ``_raw``)."""
    cfg.validate()
    if cfg.experiment == "linear":
        return _run_linear(cfg, progress)
    from peerd.sim.cordial_mnist import run_pairwise10

    return run_pairwise10(cfg.resolved_agents(), cfg.images_per_digit, cfg.epochs, cfg.seeds,
                          cfg.seed, cfg.methods, progress)


def _run_linear(cfg: CordialConfig, progress: Progress | None) -> dict[str, Any]:
    configs: list[dict[str, Any]] = []
    curves: list[LinearCurves] = []
    for dist in cfg.distributions:
        for n in cfg.resolved_agents():
            label = f"N={n} {dist}"
            started = time.monotonic()

            def step(k: int, label: str = label) -> None:
                if progress is not None:
                    progress(label, k)

            c = run_linear(n, dist, cfg.runs, cfg.iterations, cfg.seed, step)
            row = summarise(c)
            row["wall_s"] = round(time.monotonic() - started, 1)
            configs.append(row)
            curves.append(c)
    return {
        "experiment": "linear",
        "settings": {"runs": cfg.runs, "iterations": cfg.iterations, "seed": cfg.seed,
                     "agents": list(cfg.resolved_agents()),
                     "distributions": list(cfg.distributions), "d": 2, "m": 1, "batch": 10,
                     "kappa": 0.8, "eps0": 0.1, "eta0": 0.05, "alpha": 0.6, "beta": 1.0,
                     "t0": 100, "rho": "(t+1)^0.05"},
        "configs": configs,
        "_raw": curves,
    }


def public(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without the raw arrays (what ``--json`` prints and the JSON file holds)."""
    return {k: v for k, v in summary.items() if not k.startswith("_")}


def write_outputs(summary: dict[str, Any], out: Path, *, plots: bool = True) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    exp = summary["experiment"]
    json_path = out / f"cordial-{exp}.json"
    json_path.write_text(json.dumps(public(summary), indent=1, sort_keys=True) + "\n")
    written = [json_path]
    if exp == "linear":
        written.append(_linear_csv(summary["_raw"], out / "cordial-linear.csv"))
        if plots:
            written.append(_linear_plot(summary["_raw"], out / "cordial-linear.png"))
    else:
        from peerd.sim.cordial_mnist import write_pairwise_outputs

        written += write_pairwise_outputs(summary, out, plots=plots)
    return written


def _linear_csv(curves: list[LinearCurves], path: Path) -> Path:
    """Median and 10th/90th percentiles over runs, at ~40 points per configuration."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["n", "distribution", "iteration", "cordial_median", "cordial_p10",
                    "cordial_p90", "isolated_median", "best_isolated_median"])
        for c in curves:
            pts = np.asarray(c.points)
            keep = np.unique(np.concatenate([
                np.searchsorted(pts, np.geomspace(1, pts[-1], 40).round()), [len(pts) - 1]]))
            best = float(np.median(c.best_isolated))
            for k in keep[keep < len(pts)]:
                col = c.cordial[:, k]
                w.writerow([c.n, c.distribution, int(pts[k]), f"{np.median(col):.6g}",
                            f"{np.percentile(col, 10):.6g}", f"{np.percentile(col, 90):.6g}",
                            f"{np.median(c.isolated[:, k]):.6g}", f"{best:.6g}"])
    return path


def _linear_plot(curves: list[LinearCurves], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: never open a window
    import matplotlib.pyplot as plt

    dists = sorted({c.distribution for c in curves}, key=DISTRIBUTIONS.index)
    ns = sorted({c.n for c in curves})
    fig, axes = plt.subplots(len(dists), len(ns), figsize=(3.2 * len(ns), 2.6 * len(dists)),
                             squeeze=False, sharex=True)
    for c in curves:
        ax = axes[dists.index(c.distribution)][ns.index(c.n)]
        pts = np.maximum(np.asarray(c.points), 1)
        for vals, name, colour in ((c.cordial, "cordial", "C0"), (c.isolated, "isolated", "C1")):
            ax.plot(pts, np.median(vals, 0), color=colour, lw=1.2, label=name)
            ax.fill_between(pts, np.percentile(vals, 10, 0), np.percentile(vals, 90, 0),
                            color=colour, alpha=0.2, lw=0)
        ax.axhline(float(np.median(c.best_isolated)), color="k", ls="--", lw=0.8,
                   label="best isolated")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"N={c.n}, {c.distribution} ({c.cordial.shape[0]} runs)", fontsize=9)
        ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("iteration", fontsize=8)
    for row in axes:
        row[0].set_ylabel("loss (mean over agents)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
