"""Rebuild the Cached-DFL tables of docs/reproduction.md from runs of ``peerd sim``.

Run: ``nice -n 10 .venv/bin/python -m benchmarks.reproduce --quick`` (the tables that take
seconds to a few minutes: the smoke runs and the paper-calibrated cache statistics) or
``--full`` (also the long MNIST / FashionMNIST runs; their wall times go into the report).
``--tables`` only re-renders the tables from the committed outputs; ``--only A,B`` runs those
experiments only; ``--missing`` skips runs whose outputs exist (resuming an interrupted run).

Every run is :func:`peerd.sim.runner.run` on a :class:`~peerd.sim.runner.SimConfig` (the same
code ``peerd sim`` calls; ``run.json`` records the equivalent command line). Its small outputs
go to ``docs/results/<experiment>/<run>/``: ``summary.json`` and ``metrics.csv`` exactly as
``peerd sim --out`` writes them, and ``run.json`` (command, wall and CPU seconds, date). The
tables are rendered only from those files (:mod:`benchmarks.reproduce_tables`) and written
between ``<!-- reproduce:table NAME -->`` and ``<!-- /reproduce -->`` in the report, so the
prose around them is hand-written and every number in them can be traced to a file
(``tests/docs/test_reproduction_report.py`` re-renders and compares). Owns docs/results/ and
those marked blocks; it must not touch the report's other text or docs/reproduction/ (whose
FedCache JSONs :mod:`benchmarks.reproduce_fedcache` reads to render its marked tables).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import resource
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks._provenance import Started, start

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
REPORT = ROOT / "docs" / "reproduction.md"
BEGIN = re.compile(r"<!-- reproduce:table ([a-z0-9-]+) -->\n")
END = "<!-- /reproduce -->"


@dataclass(frozen=True)
class Run:
    name: str  # folder under docs/results/<experiment>/
    config: Any  # peerd.sim.runner.SimConfig (imported lazily: --tables needs no torch)


@dataclass(frozen=True)
class Experiment:
    name: str  # folder under docs/results/
    tier: str  # "quick" (CI time) or "full"
    runs: tuple[Run, ...]


@dataclass(frozen=True)
class RunOutput:
    summary: dict[str, Any]
    rows: list[dict[str, str]]  # metrics.csv
    meta: dict[str, Any]  # run.json

    def result(self, alg: str) -> dict[str, Any]:
        return dict(self.summary["results"][alg])

    def row(self, alg: str, rnd: int) -> dict[str, str]:
        for r in self.rows:
            if r["algorithm"] == alg and int(r["round"]) == rnd:
                return r
        raise KeyError(f"no metrics row for {alg} round {rnd}")

    def accuracy(self, alg: str, rnd: int) -> float:
        return float(self.row(alg, rnd)["accuracy_mean"])

    def std(self, alg: str, rnd: int) -> float:
        return float(self.row(alg, rnd)["accuracy_std"])

    def column_mean(self, alg: str, column: str, first: int, last: int) -> float:
        """Mean of a metrics.csv column over rounds first..last (inclusive)."""
        vals = [float(r[column]) for r in self.rows
                if r["algorithm"] == alg and first <= int(r["round"]) <= last and r[column]]
        if not vals:
            raise KeyError(f"no {column} for {alg} in rounds {first}..{last}")
        return sum(vals) / len(vals)


class MissingOutputsError(FileNotFoundError):
    """A table needs a run whose outputs are not there (not run yet, or not affordable)."""

    def __init__(self, experiment: str, name: str) -> None:
        super().__init__(f"no outputs for {experiment}/{name}")
        self.experiment, self.name = experiment, name

    def note(self) -> str:
        """What the report says instead of the table."""
        return (f"*Not run on the current core (no `docs/results/{self.experiment}/{self.name}/`"
                f"): `python -m benchmarks.reproduce --full --only {self.experiment}` makes it.*\n")


class Outputs:
    """The committed outputs under one results folder, loaded on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def run(self, experiment: str, name: str) -> RunOutput:
        folder = self.root / experiment / name
        if not (folder / "run.json").is_file():  # run.json is written last
            raise MissingOutputsError(experiment, name)
        with (folder / "metrics.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
        return RunOutput(
            summary=json.loads((folder / "summary.json").read_text()),
            rows=rows,
            meta=json.loads((folder / "run.json").read_text()),
        )


#: SimConfig fields whose flag is not the field's name: the flag is the daemon config's key
#: (``peerd sim``'s old spelling is a deprecated alias, docs/simulator.md).
_FLAG_NAMES = {"round_seconds": "round-interval-s"}


def command(config: Any) -> str:
    """The ``peerd sim`` command line that gives ``config`` (options that differ from the
    defaults only)."""
    from peerd.sim.runner import SimConfig

    default = SimConfig()
    parts = ["peerd sim"]
    for fl in fields(SimConfig):
        value, base = getattr(config, fl.name), getattr(default, fl.name)
        if value == base:
            continue
        flag = "--" + _FLAG_NAMES.get(fl.name, fl.name.replace("_", "-"))
        if fl.name == "batched":
            parts.append("--per-agent-loop")
        elif fl.name == "mixed_schema":
            parts.append(flag)
        elif fl.name == "algorithms":
            parts.append(f"{flag} {','.join(value)}")
        elif fl.name == "capacity" and value == config.agents:
            parts.append(f"{flag} unlimited")
        elif isinstance(value, float):
            parts.append(f"{flag} {value:g}")
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def execute(config: Any, out: Path, started: Started | None = None) -> float:
    """One run: its outputs into ``out``; returns its wall seconds. ``started``: the
    provenance of the ``benchmarks.reproduce`` invocation, recorded with this run's wall time
    beside its full configuration (every field, defaults included)."""
    from peerd.sim.output import write_outputs
    from peerd.sim.runner import run

    wall, cpu = time.perf_counter(), _cpu()
    result = run(config)
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    write_outputs(result, out, plots=False)
    (out / "metrics.json").unlink()  # the CSV holds the same rows; keep the committed files small
    meta = {
        "command": command(config),
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(cpu, 1),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "info": result.info,
        "config": _jsonable_config(config),
    }
    if started is not None:
        meta["provenance"] = started.record() | {"wall_s": round(wall, 1)}
    (out / "run.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return wall


def _jsonable_config(config: Any) -> dict[str, Any]:
    out = {}
    for fl in fields(config):
        value = getattr(config, fl.name)
        out[fl.name] = list(value) if isinstance(value, tuple) else value
    cleaned: dict[str, Any] = json.loads(json.dumps(out, default=str))
    return cleaned


def _execute_job(job: tuple[Any, str, Started | None]) -> tuple[str, float]:
    import torch

    torch.set_num_threads(1)  # several runs share two cores: one thread each
    config, out, started = job
    return out, execute(config, Path(out), started)


def run_experiments(experiments: Iterable[Experiment], results: Path, *, jobs: int = 1,
                    missing: bool = False, log: Callable[[str], None] = print,
                    started: Started | None = None) -> None:
    """Run every run of ``experiments`` (``missing``: only those without a ``run.json``)."""
    todo = [(r.config, str(results / e.name / r.name), started)
            for e in experiments for r in e.runs
            if not (missing and (results / e.name / r.name / "run.json").is_file())]
    if jobs <= 1:
        for job in todo:
            out, wall = _execute_job(job)
            log(f"{out}: {wall:.0f} s")
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for out, wall in pool.map(_execute_job, todo):
            log(f"{out}: {wall:.0f} s")


def render_report(text: str, tables: Mapping[str, Callable[[Outputs], str]],
                  outputs: Outputs) -> str:
    """``text`` with every marked block replaced by its table rendered from ``outputs``; a
    table whose runs are missing becomes a line naming the command that makes them."""
    out, pos = [], 0
    for m in BEGIN.finditer(text):
        end = text.find(END, m.end())
        if end < 0:
            raise ValueError(f"table {m.group(1)}: no closing {END}")
        name = m.group(1)
        if name not in tables:
            raise ValueError(f"the report marks an unknown table {name!r}")
        try:
            body = tables[name](outputs).rstrip("\n") + "\n"
        except MissingOutputsError as missing:
            body = missing.note()
        out += [text[pos:m.end()], body]
        pos = end
    out.append(text[pos:])
    return "".join(out)


def marked_tables(text: str) -> dict[str, str]:
    """The report's marked blocks, by table name."""
    blocks = {}
    for m in BEGIN.finditer(text):
        end = text.find(END, m.end())
        blocks[m.group(1)] = text[m.end():end]
    return blocks


def select(experiments: Sequence[Experiment], *, full: bool,
           only: Sequence[str] = ()) -> list[Experiment]:
    known = {e.name for e in experiments}
    unknown = [n for n in only if n not in known]
    if unknown:
        raise SystemExit(f"unknown experiment(s) {unknown}; choose from {sorted(known)}")
    if only:  # in the order given: the most wanted first
        return [next(e for e in experiments if e.name == n) for n in only]
    return [e for e in experiments if full or e.tier == "quick"]


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.reproduce_tables import EXPERIMENTS, TABLES

    p = argparse.ArgumentParser(prog="python -m benchmarks.reproduce", description=__doc__)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--quick", action="store_true", help="run the quick experiments")
    mode.add_argument("--full", action="store_true", help="run every experiment")
    mode.add_argument("--tables", action="store_true", help="only re-render the tables")
    p.add_argument("--only", default="", help="comma list of experiments to run")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (one thread each)")
    p.add_argument("--missing", action="store_true",
                   help="skip runs whose outputs exist (resume an interrupted --full)")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--report", type=Path, default=REPORT)
    args = p.parse_args(argv)
    if not args.tables:
        only = [n.strip() for n in args.only.split(",") if n.strip()]
        run_experiments(select(EXPERIMENTS, full=args.full, only=only), args.results,
                        jobs=args.jobs, missing=args.missing, started=start(p, args))
    text = args.report.read_text()
    args.report.write_text(render_report(text, TABLES, Outputs(args.results)))
    print(f"tables written to {args.report}")
    return 0


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: the tables module imports
    # benchmarks.reproduce, and its exception and Outputs classes must be the same objects.
    from benchmarks.reproduce import main as imported_main

    sys.exit(imported_main())
