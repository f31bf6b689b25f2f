"""The same Flower app on Flower's simulation and on peerd: accuracy per round (issue 26).

Run: ``nice -n 10 .venv/bin/python -m benchmarks.flower_vs_peerd`` (a few minutes on two
cores; ``--write`` stores the JSON under docs/results/flower-vs-peerd/ and renders
docs/learners.md's "Flower and peerd side by side" table from it; without it the JSON goes
to ``--out``, by default a temporary folder).

examples/flower_app, unchanged, N nodes with the IID partitions ``partition-id`` i of N,
R rounds, on both:
* Flower (benchmarks/_flower_sim.py): ``flwr run`` of the app on Flower's simulation
  runtime (Ray backend), its ServerApp's FedAvg; the per-round numbers are the ServerApp's.
* peerd (benchmarks/_flower_peerd.py): N daemons, each running the app's ClientApp as its
  learner; synchronous rounds (every pair gossips after each), C = 10, τ_max = 600 s,
  α = examples, ρ = 0.

Needs root (``unshare -n``) and the Flower environment with ``flwr[simulation]``
(``--flower-python``, default .venv-flower/bin/python; scripts/setup installs only the
``flower`` extra: add ``.venv-flower/bin/python -m pip install 'flwr[simulation]==1.39.0'``,
which brings Ray 2.55.1, flwr's pin, in place of the 2.52.0 of peerd's ``ray`` extra).
Flower's commands are found on that environment's bin/ folder, so their scripts must run
under its interpreter.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import _provenance
from benchmarks._flower_peerd import run_peerd
from benchmarks._flower_sim import run_flower
from benchmarks._report import commit, machine, write_section

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "flower_app"
RESULT = ROOT / "docs" / "results" / "flower-vs-peerd" / "accuracy-per-round.json"
LEARNERS = ROOT / "docs" / "learners.md"
MARK = "flower-vs-peerd"


def _versions(python: Path) -> dict[str, str]:
    probe = ("import flwr, ray, torch; print(flwr.__version__, ray.__version__, "
             "torch.__version__)")
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    return {"flwr": out[0], "ray": out[1], "torch": out[2]}


def run(nodes: int, rounds: int, cpus: int, flower_python: Path, work: Path) -> dict[str, Any]:
    flower = run_flower(APP, work / "flower", flower_python, nodes, rounds, cpus,
                        timeout_s=60.0 * (5 + rounds))
    peerd = run_peerd(APP, work / "peerd", flower_python, nodes, rounds)
    return {"nodes": nodes, "rounds": rounds, "versions": _versions(flower_python),
            "flower": flower, "peerd": peerd}


def render(r: dict[str, Any]) -> list[str]:
    f, p = r["flower"], r["peerd"]
    n, rounds = r["nodes"], r["rounds"]
    lines = [
        f"Measured at `{r['commit']}` on {r['machine']}: `{r['command']}` "
        f"(flwr {r['versions']['flwr']}, Ray {r['versions']['ray']}; readings in "
        "[`results/flower-vs-peerd/accuracy-per-round.json`]"
        "(results/flower-vs-peerd/accuracy-per-round.json)). "
        f"{n} nodes, {rounds} rounds, accuracy on the ServerApp's held-out set "
        f"({'' if not r['dirty'] else 'uncommitted changes; '}one run each).",
        "",
        "| round | Flower: global model | Flower: ClientApps' evaluation "
        "| peerd: x̄ per node (min–max) | peerd: trained model, mean | peerd: ClientApps' "
        "evaluation, mean |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k in range(rounds + 1):
        blend = [node[k] for node in p["blend_accuracy"]]
        row = [str(k), f"{f['central_accuracy'][k]:.3f}",
               "" if k == 0 else f"{f['client_eval_acc'][k - 1]:.3f}",
               f"{statistics.mean(blend):.3f} ({min(blend):.3f}–{max(blend):.3f})"]
        if k == 0:
            row += ["", ""]
        else:
            trained = [node[k - 1] for node in p["trained_accuracy"]]
            own = [a for a in (node[k - 1] for node in p["client_eval_acc"]) if a is not None]
            row += [f"{statistics.mean(trained):.3f}",
                    f"{statistics.mean(own):.3f}" if own else "—"]
        lines.append("| " + " | ".join(row) + " |")
    failed = sum(sum(x.values()) for x in p["learner_failed"])
    lines += [
        "",
        f"{failed} of peerd's learner calls failed. The times are not a comparison (Ray's "
        "start-up, a shared machine, peerd's fleet in one process): Flower's `flwr run` took "
        f"{f['wall_s']:.0f} s, {f['strategy_s']:.0f} s of it in its strategy; peerd's "
        f"{rounds} rounds {sum(p['round_s']):.0f} s.",
    ]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--cpus", type=int, default=2, help="Ray's init-args-num-cpus")
    ap.add_argument("--flower-python", type=Path, default=ROOT / ".venv-flower/bin/python")
    ap.add_argument("--out", type=Path, default=None, help="the JSON (default: a temp dir)")
    ap.add_argument("--write", action="store_true",
                    help=f"store the JSON as {RESULT.relative_to(ROOT)}, render docs/learners.md")
    args = ap.parse_args()
    started = _provenance.start(ap, args)
    with tempfile.TemporaryDirectory() as tmp:
        r = run(args.nodes, args.rounds, args.cpus, args.flower_python.absolute(), Path(tmp))
    head = commit(("peerd", "benchmarks", "examples/flower_app"))
    r.update(commit=head.removesuffix("+dirty"), dirty=head.endswith("+dirty"),
             machine=machine(), date=f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
             command="python -m benchmarks.flower_vs_peerd " + shlex.join(sys.argv[1:]),
             provenance=started.record())
    print("\n".join(render(r)))
    out = RESULT if args.write else args.out or Path(tempfile.mkdtemp()) / RESULT.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=1) + "\n")
    print(f"wrote {out}")
    if args.write:
        write_section(MARK, "\n".join(render(r)), doc=LEARNERS)


if __name__ == "__main__":
    main()
