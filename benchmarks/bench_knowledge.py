"""Bytes per round per node: knowledge mode vs weight mode, by the daemons' own byte counters.

    sudo .venv/bin/python -m benchmarks.bench_knowledge [--rounds 6] [--quick] [--no-write]
        [--render]

The readings (with their provenance) go to docs/reproduction/knowledge.json and the section
of docs/benchmarks.md is rendered from them (``--render`` re-renders without measuring;
benchmarks/docs_tables.py and tests/docs re-render and diff it).

The paper's setting (FedCache, seed ``fedcache-notes-zh.txt``): FashionMNIST, ~200 samples
per node (slices 0-2 of 300, Dirichlet α = 1.0), the ``large`` model (263k parameters, the
paper's 266k A3). Three real `peerd run` daemons in three network namespaces (mDNS on), one
mode after the other in the same run: each mesh warms up until every node holds both
peers' entries (in knowledge mode: and their keys), then the byte counters of ``peerd status``
(``node.bytes_in`` / ``bytes_out``: everything the transport moved, Noise and Yamux framing,
sessions and their control frames included) are read at the start and the end of a window
of ``--rounds`` rounds (``--quick``: 2); bytes per round per node = Δ(in + out) / Δround. The ratio of the two
modes is the result (a knowledge node must move ≤ 1/50 of a weight node's bytes). The keys
entries, sent once, fall in the warm-up and are reported beside the window. Knowledge mode
trains with the daemon's own knowledge-mode defaults (``KNOWLEDGE_DEFAULTS``: one local epoch,
batch 8, lr 0.01, the paper's); weight mode is given the same batch and lr and 25 steps (about
one epoch of ~200 samples), since it has no epoch setting.

Also states the break-even model size where knowledge stops paying, from the entry sizes
(``P* = m·(4 + 2·C) / 4`` float32 parameters for m samples and C classes). Not a CI test.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks._daemons import Daemon, make_fleet, running, wait_for, write_config

TASK = {"name": "fashion-mnist", "partition": "dirichlet:1.0", "node_count": 300,
        "model": "large"}
COMMON = {"round_interval_s": 10.0, "tau_max": 120.0, "capacity": 2}
MODES: dict[str, dict[str, Any]] = {
    "weights": {**COMMON, "mode": "weights", "alpha": "uniform", "rho": 0.01,
                "local_steps": 25, "batch_size": 8, "lr": 0.01},
    # No training keys: the daemon's knowledge-mode defaults (one epoch, batch 8, lr 0.01).
    "knowledge": {**COMMON, "mode": "knowledge"},
}
NODES = 3
WARMUP_TIMEOUT_S = 300.0


def _status(d: Daemon) -> dict[str, Any]:
    return d.status() or {}


def _cached(d: Daemon) -> int:
    return len(_status(d).get("cache", ()))


def _counters(d: Daemon) -> tuple[int, int, int]:
    node = _status(d)["node"]
    return int(node["round"]), int(node["bytes_in"]), int(node["bytes_out"])


def run_mode(mode: str, rounds: int) -> dict[str, Any]:
    from tests.net.netns import netns_lan

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="peerd-know-")))
        hosts = stack.enter_context(netns_lan(NODES))
        daemons = make_fleet(tmp, NODES, hosts=hosts)
        for i, d in enumerate(daemons):
            write_config(d, static=[], mdns=True, learning=MODES[mode],
                         task={**TASK, "node_index": i})
        stack.enter_context(running(daemons))
        t0 = time.monotonic()
        for d in daemons:
            d.start({})
        # Warm: every node holds both peers' entries and has run a round since (so the
        # one-off keys entries have crossed).
        wait_for(lambda: all(_cached(d) == NODES - 1 for d in daemons), WARMUP_TIMEOUT_S,
                 "every node to hold both peers' entries", daemons)
        first = {d.name: _counters(d) for d in daemons}
        wait_for(lambda: all(_counters(d)[0] > first[d.name][0] for d in daemons),
                 WARMUP_TIMEOUT_S, "one more round everywhere", daemons)
        start = {d.name: _counters(d) for d in daemons}
        warm_s = time.monotonic() - t0
        wait_for(lambda: all(_counters(d)[0] >= start[d.name][0] + rounds for d in daemons),
                 rounds * COMMON["round_interval_s"] * 3 + 60, f"{rounds} rounds", daemons)
        end = {d.name: _counters(d) for d in daemons}
        nodes = []
        for d in daemons:
            (r0, i0, o0), (r1, i1, o1) = start[d.name], end[d.name]
            status = _status(d)
            nodes.append({"rounds": r1 - r0, "in": (i1 - i0) / (r1 - r0),
                          "out": (o1 - o0) / (r1 - r0), "warmup_bytes": i0 + o0,
                          "val_accuracy": status["node"].get("val_accuracy"),
                          "cache": [(c["origin"][-6:], c["examples"]) for c in status["cache"]]})
    return {"mode": mode, "warmup_s": warm_s, "nodes": nodes}


#: The committed readings the doc's section is rendered from (docs_tables re-renders it).
READINGS = Path(__file__).resolve().parent.parent / "docs" / "reproduction" / "knowledge.json"


def measure(rounds: int) -> dict[str, Any]:
    """Every reading of the section, JSON-able."""
    from peerd.daemon.config_learning import KNOWLEDGE_DEFAULTS

    return {"rounds": rounds, "learning": MODES, "knowledge_defaults": KNOWLEDGE_DEFAULTS,
            "modes": {m: run_mode(m, rounds) for m in MODES}}


def _training(r: dict[str, Any]) -> str:
    w, k = r["learning"]["weights"], r["knowledge_defaults"]
    steps = "one local epoch" if k["local_steps"] == 0 else f"{k['local_steps']} steps"
    return (f"Knowledge mode trains with the daemon's knowledge-mode defaults ({steps}, batch "
            f"{k['batch_size']}, lr {k['lr']:g}); weight mode with {w['local_steps']} steps, "
            f"batch {w['batch_size']}, lr {w['lr']:g}.")


def render(r: dict[str, Any]) -> str:
    """The doc's section from one run's readings."""
    results = r["modes"]
    per = {m: statistics.mean(n["in"] + n["out"] for n in res["nodes"])
           for m, res in results.items()}
    ratio = per["knowledge"] / per["weights"]
    lines = [
        "## Knowledge vs weights: bytes per round per node",
        "",
        "Three `peerd run` daemons in "
        "three network namespaces (mDNS on) per mode, one mode after the other: FashionMNIST, "
        "nodes 0-2 of 300 Dirichlet(1.0) slices (~200 samples each), `[task] model = "
        "\"large\"` (263,306 parameters, the paper's 266k model), C = 2, round interval "
        f"{COMMON['round_interval_s']:g} s. Bytes are the daemons' own transport counters "
        "(`peerd status`: `node.bytes_in` + `bytes_out`, sessions and framing included) over "
        f"a window of {r['rounds']} rounds after warm-up, divided by the rounds each node ran "
        "in it. " + _training(r),
        "",
        "| mode | node | rounds | in / round | out / round | in + out / round | bytes before the window |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode, res in results.items():
        for i, n in enumerate(res["nodes"]):
            lines.append(f"| {mode} | node{i} | {n['rounds']} | {n['in']:,.0f} | "
                         f"{n['out']:,.0f} | {n['in'] + n['out']:,.0f} | "
                         f"{n['warmup_bytes']:,} |")
    lines += [
        "",
        f"Mean per node and round: weights {per['weights']:,.0f} B, knowledge "
        f"{per['knowledge']:,.0f} B: **knowledge moves {ratio:.4f} of weight mode's bytes "
        f"(1/{1 / ratio:.0f})**; the target is ≤ 1/50. \"Bytes before the window\" includes the "
        "one-off keys entries (~26 KB each at key_dim 64) and the first models.",
        "",
        "Break-even: a knowledge entry of m samples and C classes has a payload of "
        "m·(4 + 2·C) bytes (int32 ids, float16 logits), a float32 model 4·P; both carry a "
        "signed head of a few hundred bytes and the same session overhead. Knowledge is "
        "cheaper only while P > m·(4 + 2·C)/4: for ~200 samples of 10 classes that is "
        "P > 1,200 parameters, so a tiny model (a 650-parameter linear classifier on 8×8 "
        "digits, with ~600 samples: 14,400 B of logits against 2,600 B of weights) is cheaper "
        "to exchange as weights. Every model the paper uses is 60-220× above the break-even.",
    ]
    if "provenance" in r:
        from benchmarks import _provenance  # needs `python -m` from the repo root

        lines += ["", _provenance.line(r["provenance"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    from benchmarks._report import readings_parser, run_section  # `python -m` from the root

    parser = readings_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    if not args.render:
        from tests.net.netns import skip_reason

        reason = skip_reason()
        if reason is not None:
            sys.exit(f"needs network namespaces: {reason}")
    rounds = 2 if args.quick else args.rounds
    run_section("knowledge", parser, args, READINGS, lambda: measure(rounds), render)


if __name__ == "__main__":
    main()
