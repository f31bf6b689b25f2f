"""Writing a run's metrics (CSV, JSON) and plots (PNG) into the output folder.

It writes only into the folder it is given and computes no metric: the numbers are the
runner's (:class:`peerd.sim.runner.SimResult`). matplotlib is imported only to plot.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from peerd.sim.runner import RoundRecord, SimResult


def _clean(value: Any) -> Any:
    # JSON has no NaN: a metric that does not apply (no cache, no evaluation) becomes null.
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def summary_json(result: SimResult) -> dict[str, Any]:
    return _clean(result.summary())  # type: ignore[no-any-return]


def write_outputs(result: SimResult, out: Path, *, plots: bool = True,
                  provenance: dict[str, Any] | None = None) -> list[Path]:
    """Write ``metrics.csv``, ``metrics.json``, ``summary.json`` and the PNG plots;
    ``metrics.json`` carries ``provenance`` (:mod:`peerd.sim.provenance`) when given."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    csv_path = out / "metrics.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        names = [fl.name for fl in fields(RoundRecord)]
        writer.writerow(names)
        for rec in result.records:
            writer.writerow(["" if _is_nan(v) else v for v in (getattr(rec, n) for n in names)])
    written.append(csv_path)
    metrics = {
        "config": result.config.to_json(),
        "info": result.info,
        "rounds": [asdict(r) for r in result.records],
    }
    if provenance is not None:
        # Beside the wall times, not in summary.json: a seed's summary stays byte-identical
        # on every engine and worker count (docs/simulator.md), and a date would break that.
        metrics["provenance"] = provenance
    for name, doc in (("metrics.json", metrics), ("summary.json", result.summary())):
        path = out / name
        path.write_text(json.dumps(_clean(doc), indent=1, sort_keys=True) + "\n")
        written.append(path)
    if plots:
        written += write_plots(result, out)
    return written


def _is_nan(v: object) -> bool:
    return isinstance(v, float) and math.isnan(v)


def write_plots(result: SimResult, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only: never open a window, works without a display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    cfg = result.config
    model = result.info.get("model", cfg.model)
    title = (
        f"{cfg.dataset} ({model}), {cfg.partition}, N={cfg.agents}, "
        f"C={cfg.capacity}, τmax={cfg.tau_max:g}"
    )
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for alg in cfg.algorithms:
        rows = [r for r in result.records if r.algorithm == alg and not _is_nan(r.accuracy_mean)]
        xs = [r.round for r in rows]
        mean = [r.accuracy_mean for r in rows]
        lo = [r.accuracy_mean - r.accuracy_std for r in rows]
        hi = [r.accuracy_mean + r.accuracy_std for r in rows]
        (line,) = ax.plot(xs, mean, label=alg)
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (mean ± std over agents)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "accuracy.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    rows = [r for r in result.records if r.algorithm == "cached-dfl"]
    if rows:
        fig, ax1 = plt.subplots(figsize=(7, 4.5))
        xs = [r.round for r in rows]
        ax1.plot(xs, [r.cache_avg_models for r in rows], color="tab:blue", label="cached models")
        ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax1.set_xlabel("round")
        ax1.set_ylabel("avg cached models per agent", color="tab:blue")
        ax2 = ax1.twinx()
        ages = [r.cache_avg_age for r in rows]
        ax2.plot(xs, ages, color="tab:red", label="avg age")
        ax2.set_ylabel("avg age of cached models (rounds)", color="tab:red")
        ax1.set_title(f"cached-dfl cache statistics — {title}")
        ax1.grid(alpha=0.3)
        fig.tight_layout()
        path = out / "cache.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
