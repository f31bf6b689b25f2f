"""docs/reproduction.md's FedCache tables, rendered from the committed run JSONs.

The runs are ``scripts/fedcache_reproduction.sh`` (FashionMNIST) and one ``peerd sim`` command
(MNIST), their outputs ``docs/reproduction/fedcache-<run>.json`` (not under docs/results/: the
driver :mod:`benchmarks.reproduce` does not run them). Every figure comes from the curves
(:data:`peerd.sim.maua.CURVE_COLUMNS`), never from a JSON's ``maua`` field: outputs written
before the paper's definition was adopted hold the mean of client best under that name, and
the curves give both figures at any round. The paper's numbers (:data:`PAPER`) are the only
ones that come from elsewhere. Each table function takes the Cached-DFL tables' ``Outputs`` to
share their signature and ignores it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from benchmarks import _provenance
from benchmarks.reproduce import ROOT, Outputs
from peerd.sim.fedcache_forms import describe, forms_of
from peerd.sim.maua import acc_at, maua_from_curve

FEDCACHE = ROOT / "docs" / "reproduction"

#: Seed fedcache-notes-zh.txt, FashionMNIST: Table 5 (homogeneous, A_3^C) and Table 6
#: (heterogeneous) MAUA and traffic to the target accuracy; MNIST heterogeneous, Table 6.
PAPER = {"homogeneous": "77.71 %, 0.08 G", "mixed": "77.26 %, 0.08 G", "mnist": "83.94 %"}


@dataclass(frozen=True)
class Point:
    """One method of one run at one round (the fractions the curves hold)."""

    maua: float  # max over rounds <= this one of the mean client accuracy (the paper's)
    client_best: float  # mean over clients of each client's best round so far (not MAUA)
    mean: float  # this round's mean client accuracy
    bytes: int  # the curve's traffic so far (server-equivalent for knowledge runs)


@dataclass(frozen=True)
class FedCacheRun:
    name: str
    data: dict[str, Any]

    def curve(self, alg: str) -> list[list[float]]:
        rows: list[list[float]] = self.data["curves"][alg]
        return rows

    def last(self, alg: str) -> int:
        return int(self.curve(alg)[-1][0])

    def at(self, alg: str, t: int) -> Point:
        curve = self.curve(alg)
        row = next((r for r in curve if int(r[0]) == t), None)
        if row is None:
            raise KeyError(f"fedcache-{self.name}: {alg} has no round {t}")
        return Point(maua_from_curve(curve, upto=t), float(row[2]), float(row[1]), int(row[3]))

    def gossip(self, alg: str, t: int) -> int:
        """Knowledge gossip all-to-all to round ``t``: the curves hold the server-equivalent
        bytes, keys + (2t - 1) rounds of logits, so one round's logits and the keys follow,
        and gossip is (K - 1) x (keys + t rounds of logits). Checked against the run's total."""
        curve = self.curve(alg)
        logits = (int(curve[1][3]) - int(curve[0][3])) // 2
        keys = int(curve[0][3]) - logits
        k = int(self.data["config"]["agents"])
        total = self.data["traffic_bytes"][alg]["gossip_all_to_all"]
        if (k - 1) * (keys + self.last(alg) * logits) != total:
            raise ValueError(f"fedcache-{self.name}: gossip total does not follow the formula")
        return (k - 1) * (keys + t * logits)

    def models_moved(self, t: int) -> int:
        params = int(self.data["info"]["cached-dfl"]["parameters"]["large"])
        return self.at("cached-dfl", t).bytes // (params * 4)


@cache
def _load(name: str, folder: Path) -> FedCacheRun:
    return FedCacheRun(name, json.loads((folder / f"fedcache-{name}.json").read_text()))


def load(name: str) -> FedCacheRun:
    return _load(name, FEDCACHE)


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def _gain(a: float, b: float) -> str:
    return f"{100 * (a - b):+.2f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "".join("| " + " | ".join(r) + " |\n" for r in lines)


def _common(runs: Sequence[tuple[str, str]]) -> int:
    """The last round every (run, algorithm) reached."""
    return min(load(r).last(a) for r, a in runs)


def _traffic(run: FedCacheRun, alg: str, t: int) -> str:
    p = run.at(alg, t)
    if alg == "isolated":
        return "0"
    if alg == "cached-dfl":
        return f"{p.bytes / 1e9:.2f} GB ({run.models_moved(t):,} models)"
    return f"{p.bytes / 1e9:.3f} GB server-eq.; {run.gossip(alg, t) / 1e9:.2f} GB gossip"


def measured_with(names: Sequence[str]) -> str:
    """The forms each run of a table was measured with, from its config (a config without the
    keys is a run of the old forms): one line, naming the runs when they differ."""
    by: dict[str, list[str]] = {}
    for name in dict.fromkeys(names):
        by.setdefault(describe(load(name).data["config"]), []).append(name)
    if len(by) == 1:
        return f"\nMeasured with: {next(iter(by))}.\n"
    return "".join(f"\nMeasured with ({', '.join(n)}): {d}.\n" for d, n in by.items())


def _comparison(clients: str, runs: Sequence[tuple[str, str]], paper: str, early: int) -> str:
    t = _common(runs)
    header = ["clients", "method", f"MAUA @ round {early}", f"MAUA @ round {t}",
              f"mean of client best @ round {t}", f"traffic to round {t}", "paper"]
    rows = []
    for name, alg in runs:
        run = load(name)
        rows.append([clients, alg if alg != "cached-dfl" else "cached-dfl (mobility)",
                     _pct(run.at(alg, early).maua), _pct(run.at(alg, t).maua),
                     _pct(run.at(alg, t).client_best), _traffic(run, alg, t),
                     paper if alg == "fedcache" else "–"])
    return _table(header, rows) + measured_with([n for n, _ in runs])


HOMOGENEOUS = (("fmnist-fc-homo", "fedcache"), ("fmnist-iso-homo", "isolated"),
               ("fmnist-cdfl", "cached-dfl"))
MIXED = (("fmnist-fc-mixed", "fedcache"), ("fmnist-iso-mixed", "isolated"))
MNIST = (("mnist-mixed", "fedcache"), ("mnist-mixed", "isolated"))


def homogeneous(o: Outputs) -> str:
    t = _common(HOMOGENEOUS)
    fc = load("fmnist-fc-homo")
    note = (f"\n¹ The JSON holds the gossip total at the run's last round "
            f"({fc.gossip('fedcache', fc.last('fedcache')) / 1e9:.2f} GB at round "
            f"{fc.last('fedcache')}); at round {t} it is the formula's (K − 1) × (keys once "
            f"+ {t} rounds of logits), with both read off the server-equivalent curve.\n")
    table = _comparison("homogeneous (large)", HOMOGENEOUS, PAPER["homogeneous"], 10)
    return table.replace(" GB gossip |", " GB gossip¹ |", 1) + note


def mixed(o: Outputs) -> str:
    return _comparison("mixed (small/medium/large)", MIXED, PAPER["mixed"], 10)


def mnist(o: Outputs) -> str:
    return _comparison("mixed (small/medium/large)", MNIST, PAPER["mnist"], 10)


def last_rounds(o: Outputs) -> str:
    rows = []
    for name, alg in (*HOMOGENEOUS, *MIXED):
        run = load(name)
        t = run.last(alg)
        p = run.at(alg, t)
        rows.append([name.removeprefix("fmnist-"), alg, str(t), _pct(p.maua),
                     _pct(p.client_best), _pct(p.mean)])
    return _table(["run", "method", "last round", "MAUA", "mean of client best",
                   "mean accuracy at that round"], rows) + measured_with(
        [n for n, _ in (*HOMOGENEOUS, *MIXED)])


R_RUNS = {1: "fmnist-fc-r1", 4: "fmnist-fc-r4", 16: "fmnist-fc-homo", 64: "fmnist-fc-r64"}


def r_ablation(o: Outputs) -> str:
    t = _common(HOMOGENEOUS)  # the round of the comparison table, where R = 16 is read
    runs = [load(n) for n in R_RUNS.values()]
    rows = [[f"MAUA @ {t}", *(_pct(r.at("fedcache", t).maua) for r in runs)],
            ["MAUA @ 10", *(_pct(r.at("fedcache", 10).maua) for r in runs)],
            [f"mean of client best @ {t}", *(_pct(r.at("fedcache", t).client_best)
                                            for r in runs)]]
    return _table(["R", *(str(r) for r in R_RUNS)], rows) + measured_with(list(R_RUNS.values()))


#: (label, fedcache run, isolated run, the runs whose common last round both are read at).
GAINS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("FashionMNIST homogeneous, α = 1, seed 0", "fmnist-fc-homo", "fmnist-iso-homo",
     ("fmnist-fc-homo", "fmnist-iso-homo", "fmnist-cdfl")),
    ("FashionMNIST mixed, α = 1, seed 0", "fmnist-fc-mixed", "fmnist-iso-mixed",
     ("fmnist-fc-mixed", "fmnist-iso-mixed")),
    ("MNIST mixed, α = 1, seed 0", "mnist-mixed", "mnist-mixed", ("mnist-mixed",)),
    ("homogeneous, α = 1, seed 0", "fmnist-fc-homo", "fmnist-iso-homo",
     ("fmnist-fc-homo-s1", "fmnist-iso-homo-s1")),
    ("homogeneous, α = 1, seed 1", "fmnist-fc-homo-s1", "fmnist-iso-homo-s1",
     ("fmnist-fc-homo-s1", "fmnist-iso-homo-s1")),
    ("mixed, α = 1, seed 0", "fmnist-fc-mixed", "fmnist-iso-mixed",
     ("fmnist-fc-mixed-s1", "fmnist-iso-mixed-s1")),
    ("mixed, α = 1, seed 1", "fmnist-fc-mixed-s1", "fmnist-iso-mixed-s1",
     ("fmnist-fc-mixed-s1", "fmnist-iso-mixed-s1")),
    ("homogeneous, α = 3", "fmnist-fc-a3", "fmnist-iso-a3", ("fmnist-fc-a3", "fmnist-iso-a3")),
    ("homogeneous, α = 10", "fmnist-fc-a10", "fmnist-iso-a10",
     ("fmnist-fc-a10", "fmnist-iso-a10")),
)


def _round_of(names: Sequence[str]) -> int:
    return _common([(n, a) for n in names for a in load(n).data["curves"]])


def gains(o: Outputs) -> str:
    rows = []
    for label, fc_name, iso_name, names in GAINS:
        t = _round_of(names)
        fc, iso = load(fc_name).at("fedcache", t), load(iso_name).at("isolated", t)
        rows.append([label, str(t), _pct(fc.maua), _pct(iso.maua), _gain(fc.maua, iso.maua),
                     _pct(fc.client_best), _pct(iso.client_best),
                     _gain(fc.client_best, iso.client_best)])
    return _table(["run", "round", "fedcache MAUA", "isolated MAUA", "gain",
                   "fedcache mean of client best", "isolated mean of client best", "gain"],
                  rows) + measured_with([n for _, f, i, _ in GAINS for n in (f, i)])


# ------------------------------------------------------------------ the loss ablation

ABLATION = FEDCACHE / "fedcache-ablation"
#: The ablation's variants in table order (benchmarks/fedcache_ablation.py's VARIANTS).
ABLATION_VARIANTS = (("eq18", "fedcache"), ("eq18-t1", "fedcache"), ("code", "fedcache"),
                     ("isolated", "isolated"))


def _ablation_runs() -> list[tuple[str, int, str, dict[str, Any]]]:
    out = []
    for path in sorted(ABLATION.glob("*-s*.json")):
        variant, seed = path.stem.rsplit("-s", 1)
        alg = dict(ABLATION_VARIANTS)[variant]
        out.append((variant, int(seed), alg, json.loads(path.read_text())))
    order = [v for v, _ in ABLATION_VARIANTS]
    return sorted(out, key=lambda r: (r[1], order.index(r[0])))


def _hit(curve: list[list[float]], target: float) -> str:
    hit = acc_at(curve, target)
    return "not reached" if hit is None else f"round {hit['round']}, {hit['bytes'] / 1e6:.1f} MB"


def ablation(o: Outputs) -> str:
    """eq18 vs code vs isolated, each read at the last round every run of the set reached."""
    runs = _ablation_runs()
    if not runs:
        raise FileNotFoundError(f"no ablation runs under {ABLATION}")
    t = min(int(d["curves"][a][-1][0]) for _, _, a, d in runs)
    targets = [float(x) for x in runs[0][3]["config"]["targets"]]
    header = ["variant", "seed", "loss", f"MAUA @ round {t}", f"mean accuracy @ round {t}",
              *(f"acc@{100 * x:g} % (round, server-eq. bytes)" for x in targets),
              f"traffic to round {t} (server-eq., incl. indices)"]
    rows = []
    for variant, seed, alg, d in runs:
        curve = [r for r in d["curves"][alg] if int(r[0]) <= t]
        f = forms_of(d["config"])
        rows.append([variant, str(seed), "– (β = 0: CE)" if alg == "isolated" else
                     f"{f['distill_form']}, T = {d['config']['temperature']:g}", _pct(maua_from_curve(curve)), _pct(float(curve[-1][1])),
                     *(_hit(curve, x) for x in targets),
                     "0" if alg == "isolated" else f"{int(curve[-1][3]) / 1e6:.1f} MB"])
    forms = {describe({**d["config"], "distill_form": "eq18"}) for _, _, _, d in runs}
    if len(forms) != 1:
        raise ValueError(f"ablation runs differ in more than the loss form: {sorted(forms)}")
    common = next(iter(forms)).split("; ", 1)[1]
    provs = "".join(f"\n{variant}, seed {seed}: {_provenance.line(d['provenance'])}\n"
                    for variant, seed, _, d in runs)
    return (_table(header, rows) + f"\nMeasured with: {common}; loss as the column says.\n"
            + provs)


TABLES: dict[str, Callable[[Outputs], str]] = {
    "fedcache-homogeneous": homogeneous,
    "fedcache-mixed": mixed,
    "fedcache-mnist": mnist,
    "fedcache-last-rounds": last_rounds,
    "fedcache-r": r_ablation,
    "fedcache-gains": gains,
    "fedcache-ablation": ablation,
}
