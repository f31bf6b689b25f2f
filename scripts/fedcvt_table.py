"""Print the FedCVT tables of docs/reproduction.md from `peerd sim fedcvt --out` summaries.

Per file and alignment fraction: aligned people, vanilla VFL and FedCVT test accuracy (mean ±
sample std over seeds, in %), the mean gain and in how many seeds FedCVT won, and (FedCVT runs
with pseudo labels) the mean fraction of B-only rows the gate accepted and the mean precision
of the accepted pseudo labels against the rows' true labels.

    .venv/bin/python scripts/fedcvt_table.py docs/reproduction/fedcvt-*.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def rows(summary: dict[str, Any]) -> list[str]:
    out = []
    for r in summary["table"]:
        fc = [x for x in summary["runs"]
              if x["aligned"] == r["aligned"] and x["method"] == "fedcvt"]
        line = (f"  {r['aligned']}: aligned people {fc[0]['n_aligned']}, vanilla "
                f"{100 * r['vanilla_mean']:.2f} ± {100 * r['vanilla_std']:.2f}, FedCVT "
                f"{100 * r['fedcvt_mean']:.2f} ± {100 * r['fedcvt_std']:.2f}, gain "
                f"{100 * r['gain_mean']:+.2f} (wins {r['fedcvt_wins']}/{r['seeds']})")
        acc = [x["pseudo_accepted_fraction"] for x in fc
               if x.get("pseudo_accepted_fraction") is not None]
        prec = [x["pseudo_label_precision"] for x in fc
                if x.get("pseudo_label_precision") is not None]
        if acc and prec:
            line += (f", gate accepted {100 * statistics.fmean(acc):.1f} %, precision "
                     f"{100 * statistics.fmean(prec):.1f} %")
        out.append(line)
    return out


def main(paths: list[str]) -> None:
    for path in paths:
        summary = json.loads(Path(path).read_text())
        print(f"{Path(path).name} (wall {summary['wall_seconds']} s)")
        print("\n".join(rows(summary)))


if __name__ == "__main__":
    main(sys.argv[1:])
