"""docs/reproduction.md's FedCVT tables, rendered from the committed ``peerd sim fedcvt --out``
summaries (docs/reproduction/fedcvt-*.json; ``scripts/fedcvt_reproduction.sh`` makes them).

Per alignment fraction: the aligned people, vanilla VFL and FedCVT test accuracy (mean ±
sample std over seeds, in %), the mean gain and in how many seeds FedCVT won, the gate's
acceptance and precision (means over the FedCVT runs), then one column per ablation file. The
highest mean of a row (as shown, to 0.01) is in bold. Every column says which attention it was measured with: the
files record their ``sharpen`` (0: the seed's softmax(QKᵀ/√d_k); 0.1: the paper's code), and
a column whose file disagrees with its heading fails to render rather than mislabel a number.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.reproduce import Outputs

FEDCVT = Path(__file__).resolve().parent.parent / "docs" / "reproduction"

#: (heading, file suffix, the sharpen it must have been run with)
MNIST_COLUMNS = (
    ("FedCVT, gate 0.9", "-t09", 0.0),
    ("no pseudo labels", "-nopseudo", 0.0),
    ("no fill, no pseudo labels", "-nofill", 0.0),
    ("FedCVT, T = 0.1 (paper's code)", "-sharpen01", 0.1),
)
CANCER_COLUMNS = (
    ("no pseudo labels", "-nopseudo", 0.0),
    ("FedCVT, T = 0.1 (paper's code)", "-sharpen01", 0.1),
)


def _load(dataset: str, suffix: str, sharpen: float) -> dict[str, Any]:
    path = FEDCVT / f"fedcvt-{dataset}{suffix}.json"
    summary: dict[str, Any] = json.loads(path.read_text())
    got = summary["config"]["sharpen"]
    if got != sharpen:
        raise ValueError(f"{path.name} was run with sharpen {got}, its column says {sharpen}")
    return summary


def _pct(mean: float, std: float) -> str:
    return f"{100 * mean:.2f} ± {100 * std:.2f}"


def _signed(x: float) -> str:
    return f"{100 * x:+.2f}".replace("-", "−")


def _people(fraction: float, runs: Sequence[dict[str, Any]]) -> str:
    return f"{100 * fraction:g} % ({runs[0]['n_aligned']:,})"


def _gate(runs: Sequence[dict[str, Any]]) -> str:
    acc = [r["pseudo_accepted_fraction"] for r in runs]
    prec = [r["pseudo_label_precision"] for r in runs]
    if None in acc or None in prec:
        return "–"
    return f"{100 * statistics.fmean(acc):.1f} % / {100 * statistics.fmean(prec):.1f} %"


def table(dataset: str, columns: Sequence[tuple[str, str, float]]) -> str:
    main = _load(dataset, "", 0.0)
    others = [(head, _load(dataset, suffix, sharpen)) for head, suffix, sharpen in columns]
    heads = ["aligned (people)", "vanilla VFL", "FedCVT", "gain (seeds won)",
             "gate accepted / precise", *(h for h, _ in others)]
    lines = [f"| {' | '.join(heads)} |", "|" + " --- |" * len(heads)]
    for row in main["table"]:
        frac = row["aligned"]
        runs = [r for r in main["runs"] if r["aligned"] == frac and r["method"] == "fedcvt"]
        cells = [(row["vanilla_mean"], row["vanilla_std"]),
                 (row["fedcvt_mean"], row["fedcvt_std"])]
        for _, summary in others:
            other = next(r for r in summary["table"] if r["aligned"] == frac)
            cells.append((other["fedcvt_mean"], other["fedcvt_std"]))
        best = max(round(100 * m, 2) for m, _ in cells)  # as shown: a tie is bold twice
        shown = [f"**{_pct(m, s)}**" if round(100 * m, 2) == best else _pct(m, s)
                 for m, s in cells]
        lines.append("| " + " | ".join([
            _people(frac, runs), shown[0], shown[1],
            f"{_signed(row['gain_mean'])} ({row['fedcvt_wins']}/{row['seeds']})", _gate(runs),
            *shown[2:]]) + " |")
    return "\n".join(lines) + "\n"


def walls() -> str:
    """The wall seconds of every committed FedCVT output, by file."""
    parts = []
    for path in sorted(FEDCVT.glob("fedcvt-*.json")):
        parts.append(f"`{path.name}` {json.loads(path.read_text())['wall_seconds']:.0f} s")
    return "Wall time per output: " + ", ".join(parts) + ".\n"


TABLES: dict[str, Callable[[Outputs], str]] = {
    "fedcvt-mnist": lambda _o: table("mnist", MNIST_COLUMNS),
    "fedcvt-breast-cancer": lambda _o: table("breast_cancer", CANCER_COLUMNS),
    "fedcvt-walls": lambda _o: walls(),
}
