"""Flower's deployment runtime against a peerd mesh of the same hosts (issue 26, part b).

Run: ``nice -n 10 .venv/bin/python -m benchmarks.flower_vs_peerd_deploy`` (root: network
namespaces; long on a small machine: every Flower message starts a ClientApp process).
``--write`` stores the JSON as docs/results/flower-vs-peerd/deployment.json.

N hosts on one private bridge (peerd.mesh.netns), examples/flower_app unchanged on both:
* Flower (benchmarks/_flower_deploy.py): a SuperLink on host 0, a SuperNode on every host,
  ``flwr run`` of the app to the SuperLink; FedAvg for ``--rounds`` rounds.
* peerd (benchmarks/_flower_mesh.py): one daemon per host, mDNS, asynchronous rounds.
Each twice: as is, and with a fault — Flower's SuperLink killed (SIGKILL) after round
``--fault-round``'s global evaluation; peerd's last node killed once it has run that many
rounds. Measured: seconds from the first process started to the ClientApps' own evaluation
reaching ``--target`` (Flower: FedAvg's weighted mean of them; peerd: every live node's),
bytes through each host's link, and what each still had at the end.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import _provenance
from benchmarks._flower_deploy import run_deployment
from benchmarks._flower_mesh import run_mesh
from benchmarks._report import commit, machine, write_section
from benchmarks.flower_vs_peerd import APP, LEARNERS, ROOT, _versions
from peerd.mesh.netns import lan

RESULT = ROOT / "docs" / "results" / "flower-vs-peerd" / "deployment.json"
MARK = "flower-vs-peerd-deploy"


def _first(points: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, a in points if a >= target), None)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    python = args.flower_python.absolute()
    for fault in (False, True):
        name = "fault" if fault else "plain"
        if "flower" in args.sides:
            with lan(args.nodes, net=79, prefix="pdflw") as hosts:
                r = run_deployment(APP, work / f"flower-{name}", python, hosts, args.rounds,
                                   args.fault_round if fault else None, args.max_s)
            r["reached_target_s"] = _first(r["client_eval_acc"], args.target)
            out[f"flower_{name}"] = r
        if "peerd" in args.sides:
            with lan(args.nodes, net=79, prefix="pdflw") as hosts:
                out[f"peerd_{name}"] = run_mesh(
                    APP, work / f"peerd-{name}", python, hosts, args.target, args.max_s,
                    (args.nodes - 1, args.fault_round) if fault else None)
    return out


def _s(x: float | None) -> str:
    return "not reached" if x is None else f"{x:.0f} s"


def _kb(values: list[int]) -> str:
    return " / ".join(f"{v / 1000:.0f}" for v in values)


def _flower_row(name: str, f: dict[str, Any]) -> str:
    acc = f["client_eval_acc"]
    last = f"{acc[-1][1]:.3f} (round {len(acc)})" if acc else "none"
    if f["killed_superlink_at_s"] is None:
        after = f"`flwr run` exit {f['exit']}"
    else:
        after = (f"SuperLink killed at {f['killed_superlink_at_s']:.0f} s after round "
                 f"{len(f['global_accuracy'])}: `flwr run` exit {f['exit']}, no round after it")
    return (f"| {name} | {f['supernodes_up_s']:.0f} s | {_s(f['reached_target_s'])} | {last} "
            f"| {_kb(f['bytes'])} | {after} |")


def _peerd_row(name: str, p: dict[str, Any]) -> str:
    ends = [s[-1] for s in p["samples"] if s]
    last = ", ".join(f"{a:.2f}" if a is not None else "—" for _, _, a in ends)
    rounds = "/".join(str(r) for _, r, _ in ends)
    if p["killed"] is None:
        after = "—"
    else:
        i = p["killed"][0]
        alive = [s[-1] for j, s in enumerate(p["samples"]) if j != i and s]
        went = "reached the target at rounds" if p["reached_target_s"] is not None \
            else "went on to rounds"
        after = (f"node {i} killed at {p['killed_at_s']:.0f} s (its round {p['killed'][1]}); "
                 f"the other {len(alive)} {went} " + "/".join(str(r) for _, r, _ in alive)
                 + " without it")
    return (f"| {name} | {_s(p['ready_s'])} | {_s(p['reached_target_s'])} | {last} "
            f"(rounds {rounds}) | {_kb(p['bytes'])} | {after} |")


def render(r: dict[str, Any]) -> list[str]:
    runs = r["runs"]
    lines = [
        f"Measured at `{r['commit']}` on {r['machine']}: `{r['command']}` "
        f"(flwr {r['versions']['flwr']}; readings in "
        "[`results/flower-vs-peerd/deployment.json`](results/flower-vs-peerd/deployment.json)"
        f"). {r['nodes']} hosts, target: the ClientApps' evaluation ≥ {r['target']} "
        f"(Flower: FedAvg's weighted mean, {r['rounds']} rounds at most; peerd: every live "
        "node's own), seconds from the first process started; one run each.",
        "",
        "| run | all started | target reached | last ClientApp evaluation | kB through "
        "each host's link | the fault |",
        "| --- | ---: | ---: | --- | ---: | --- |",
    ]
    names = {"flower_plain": "Flower", "flower_fault": "Flower, SuperLink killed",
             "peerd_plain": "peerd", "peerd_fault": "peerd, one node killed"}
    for key, name in names.items():
        if key in runs:
            row = _flower_row if key.startswith("flower") else _peerd_row
            lines.append(row(name, runs[key]))
    lines += [
        "",
        "A run stops once the target is reached (peerd) or the last round ends (Flower), so "
        "the bytes cover different lengths: compare them per round. What a fault leaves: "
        "with the SuperLink gone, Flower's run ends there (this app's ServerApp keeps the "
        "global model in memory only, and each ClientApp process exits after its reply), "
        "so the last global model is the one before the fault; peerd's surviving nodes "
        "train on from the blends they have, each holding its own signed model.",
    ]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=6, help="Flower's num-server-rounds")
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--fault-round", type=int, default=2)
    ap.add_argument("--max-s", type=float, default=1800.0, help="each run's limit")
    ap.add_argument("--sides", default="flower,peerd")
    ap.add_argument("--flower-python", type=Path, default=ROOT / ".venv-flower/bin/python")
    ap.add_argument("--write", action="store_true", help=f"store as {RESULT.relative_to(ROOT)}")
    args = ap.parse_args()
    started = _provenance.start(ap, args)
    with tempfile.TemporaryDirectory() as tmp:
        runs = run(args, Path(tmp))
    head = commit(("peerd", "benchmarks", "examples/flower_app"))
    r = {"nodes": args.nodes, "rounds": args.rounds, "target": args.target,
         "fault_round": args.fault_round, "versions": _versions(args.flower_python),
         "runs": runs, "commit": head.removesuffix("+dirty"), "dirty": head.endswith("+dirty"),
         "machine": machine(), "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
         "command": "python -m benchmarks.flower_vs_peerd_deploy " + shlex.join(sys.argv[1:]),
         "provenance": started.record()}
    text = json.dumps(r, indent=1) + "\n"
    print(text)
    print("\n".join(render(r)))
    if args.write:
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(text)
        write_section(MARK, "\n".join(render(r)), doc=LEARNERS)


if __name__ == "__main__":
    main()
