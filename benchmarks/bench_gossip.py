"""Gossip at scale: how fast a new version spreads, and what each node pays, as N grows.

Run: ``.venv/bin/python -m benchmarks.bench_gossip --nodes 10,100,1000 --fanout 3``
(``--loss 0.01 --churn 0.1 --seed S --out DIR``; ``--no-write`` to leave docs/benchmarks.md
alone). Each N runs the simulator of the real session code (:mod:`peerd.sim.gossipsim`)
three times: no faults, with ``--loss`` (a session cut), with ``--churn`` (nodes offline),
and, for N in ``--compare``, once with fanout N − 1 (every peer every sweep: the daemon
before issue 14). Times are simulated gossip intervals (``GOSSIP_INTERVAL_S``), so they do
not depend on the machine; only the wall-clock column does.

Outputs in ``--out``: ``gossip.json`` (every run's numbers and per-probe curves) and
``gossip.png`` (intervals to 50 / 95 / 99 % against log2 N, and the spread curves).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import _provenance
from benchmarks._report import machine, write_section
from peerd.sim.gossipsim import THRESHOLDS, GossipSimConfig, GossipSimResult, simulate

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "reproduction" / "gossip"


def bound(n: int) -> float:
    """The issue's target: 99 % within 2·log2(N) + 5 intervals."""
    return 2 * math.log2(n) + 5


def summary(label: str, r: GossipSimResult) -> dict[str, Any]:
    cfg = r.config
    return {
        "label": label, "nodes": cfg.nodes, "fanout": cfg.fanout or cfg.nodes - 1,
        "loss": cfg.loss, "churn": cfg.churn, "latency_s": cfg.latency_s, "seed": cfg.seed,
        "probes": len(r.probes),
        "reach_mean": {str(x): r.reach(x) for x in THRESHOLDS},
        "reach_max": {str(x): r.reach_max(x) for x in THRESHOLDS},
        "bound_99": bound(cfg.nodes),
        "intervals": r.intervals,
        "sessions_per_node_interval": r.per_node_interval(r.started),
        "completed_per_node_interval": r.per_node_interval(r.completed),
        "bytes_per_node_interval": r.per_node_interval(r.bytes_sent),
        "entries_sent": r.entries_sent, "entries_accepted": r.entries_accepted,
        "duplicates": r.duplicates, "deduplicated": r.deduplicated,
        "lost": r.lost, "unreachable": r.unreachable, "busy": r.busy, "timeouts": r.timeouts,
        "refused": dict(r.refused), "max_per_sweep": r.max_per_sweep,
        "max_inbound_seen": r.max_inbound_seen,
        "max_outbound_seen": r.max_outbound_seen, "wall_s": r.wall_s,
        # Rounded: the spread curves of 1,000 nodes are a thousand steps per probe.
        "curves": [[(round(t, 4), round(f, 4)) for t, f in p.curve] for p in r.probes],
    }


def _fmt(x: float | None, digits: int = 1) -> str:
    return "never" if x is None else f"{x:.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| N | fanout | faults | 50 % | 95 % | 99 % (max) | 2·log2 N + 5 | sessions / node "
            "/ interval | bytes / node / interval | duplicate transfers | saved by InFlight "
            "| sessions lost / unreachable | wall s |\n"
            "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
            "| ---: |")
    lines = [head]
    for s in rows:
        m, mx = s["reach_mean"], s["reach_max"]
        lines.append(
            f"| {s['nodes']:,} | {s['fanout']} | {s['label']} | {_fmt(m['0.5'])} | "
            f"{_fmt(m['0.95'])} | {_fmt(m['0.99'])} ({_fmt(mx['0.99'])}) | {s['bound_99']:.1f} | "
            f"{s['sessions_per_node_interval']:.2f} | {s['bytes_per_node_interval']:,.0f} | "
            f"{s['duplicates']} | {s['deduplicated']} | {s['lost']} / {s['unreachable']} | "
            f"{s['wall_s']:.0f} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    ns = sorted({s["nodes"] for s in rows})
    xs = [math.log2(n) for n in ns]
    left.plot(xs, [bound(n) for n in ns], "k--", label="target 2·log2 N + 5 (99 %)")
    styles = {"none": "-", "loss": ":", "churn": "-."}
    colours = {"0.5": "tab:green", "0.95": "tab:orange", "0.99": "tab:red"}
    for label, style in styles.items():
        for x, colour in colours.items():
            pts = [(math.log2(s["nodes"]), s["reach_mean"][x]) for s in rows
                   if s["label"] == label and s["fanout"] != s["nodes"] - 1
                   and s["reach_mean"][x] is not None]
            if pts:
                left.plot(*zip(*pts, strict=True), style, color=colour, marker="o",
                          label=f"{float(x):.0%}, {label}")
    full = [(math.log2(s["nodes"]), s["reach_mean"]["0.99"]) for s in rows
            if s["fanout"] == s["nodes"] - 1 and s["reach_mean"]["0.99"] is not None]
    if full:
        left.plot(*zip(*full, strict=True), "s", color="tab:blue", label="99 %, fanout N−1")
    left.set_xlabel("log2 N")
    left.set_ylabel("gossip intervals after publishing")
    left.set_title("A new version held by 50 / 95 / 99 % of live nodes")
    left.legend(fontsize=7)
    for s in rows:
        if s["label"] != "none" or s["fanout"] == s["nodes"] - 1:
            continue
        for i, curve in enumerate(s["curves"]):
            t, f = zip(*curve, strict=True) if curve else ((), ())
            right.step(t, f, where="post", alpha=0.6,
                       color=f"C{ns.index(s['nodes'])}",
                       label=f"N = {s['nodes']:,}" if i == 0 else None)
    right.set_xlabel("gossip intervals after publishing")
    right.set_ylabel("fraction of live nodes holding it")
    right.set_title("Each probe's spread (no faults)")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for n in args.nodes:
        base = GossipSimConfig(nodes=n, fanout=args.fanout, probes=args.probes,
                               latency_s=args.latency, seed=args.seed)
        scenarios = [("none", base), ("loss", replace(base, loss=args.loss)),
                     ("churn", replace(base, churn=args.churn))]
        if n in args.compare:
            scenarios.append(("none", replace(base, fanout=None)))  # every peer every sweep
        for label, cfg in scenarios:
            s = summary(label, simulate(cfg))
            rows.append(s)
            print(table([s]).splitlines()[-1], flush=True)
    return rows


def ed25519_cost(repeat: int = 500) -> dict[str, float]:
    """Median µs to sign one simulated entry (what a publish costs) and to verify it (what
    every receipt costs), as the simulator does them: real keys, the real entry format."""
    import torch

    from benchmarks._report import median_time
    from peerd.core.limits import ValidationLimits
    from peerd.node.state import sign_own, verify
    from peerd.protocol.ledger import OriginLedger
    from peerd.sim.gossipsim import EPOCH, FLEET, SCHEMA, GossipSim

    node = next(iter(GossipSim(GossipSimConfig(nodes=2)).nodes.values())).state
    params = {"w": torch.tensor([1.0, 2.0])}

    def sign() -> object:
        return sign_own(node.key, FLEET, params=params, version=2, created_at=EPOCH,
                        num_examples=1)

    _, message = sign_own(node.key, FLEET, params=params, version=2, created_at=EPOCH,
                          num_examples=1)
    ledger = OriginLedger().view()

    def check() -> object:  # signature, membership, hash, schema, values: all pass
        return verify(message, fleet_id=FLEET, manifest=node.manifest, ledger=ledger,
                      schema=SCHEMA, limits=ValidationLimits(), now=EPOCH)

    return {"sign_us": median_time(sign, repeat) * 1e6, "verify_us": median_time(check, repeat) * 1e6}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--nodes", type=_ints, default=[10, 100, 1000])
    p.add_argument("--fanout", type=int, default=3)
    p.add_argument("--loss", type=float, default=0.01)
    p.add_argument("--churn", type=float, default=0.1)
    p.add_argument("--latency", type=float, default=0.005, help="mean one-way seconds")
    p.add_argument("--probes", type=int, default=5)
    p.add_argument("--compare", type=_ints, default=[10, 100],
                   help="N at which fanout N-1 also runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--no-write", action="store_true", help="leave docs/benchmarks.md alone")
    p.add_argument("--crypto", action="store_true",
                   help="only time signing and verifying one simulated entry")
    args = p.parse_args(argv)
    if args.crypto:
        # Its own output, with its provenance: docs/benchmarks.md's gossip prose cites it.
        started = _provenance.start(p, args)
        cost = {**ed25519_cost(), "provenance": started.record()}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "crypto.json").write_text(json.dumps(cost, indent=1) + "\n")
        print(json.dumps(cost))
        return
    if args.fanout < 1 or any(n < 2 for n in args.nodes):
        p.error("--fanout must be >= 1 and every --nodes value >= 2")
    started = _provenance.start(p, args)
    rows = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    record = started.record()
    (args.out / "gossip.json").write_text(json.dumps(
        {"machine": machine(), "settings": settings, "runs": rows,
         "provenance": record}, separators=(",", ":")))
    plot(rows, args.out / "gossip.png")
    print(table(rows))
    if not args.no_write:
        write_section("gossip", section(rows, args, record=record))


def section(rows: list[dict[str, Any]], args: argparse.Namespace,
            machine_text: str | None = None, record: dict[str, Any] | None = None) -> str:
    """The doc's section; ``machine_text``: the machine a saved run recorded (default: this
    one, for a fresh run); ``record``: its provenance, named in place of a command rebuilt
    from the settings (runs before provenance have none)."""
    nodes = ",".join(str(n) for n in args.nodes)
    ran = (_provenance.line(record) if record is not None else f"""Command: `nice -n 10 \
.venv/bin/python -m benchmarks.bench_gossip --nodes {nodes} --fanout {args.fanout} --loss \
{args.loss} --churn {args.churn} --latency {args.latency} --probes {args.probes} --seed \
{args.seed}` on {machine_text or machine()}.""")
    return f"""## Gossip at scale: spread and per-node cost against N

{ran} Outputs: `docs/reproduction/gossip/gossip.json`, \
![gossip](reproduction/gossip/gossip.png)

The simulator (`peerd.sim.gossipsim`) runs the real `NodeState`, `run_session`, `PeerTable` \
(with the fanout) and `InFlight` for N nodes in one process over in-memory links (one-way \
latency U(0.5, 1.5) × {args.latency * 1000:g} ms) on trio's mock clock; a sweep every interval \
× U(0.5, 1.5) and at once after a publish, at most 8 inbound sessions, C = 10, entries of two \
floats signed with Ed25519. The fleet starts converged; then {args.probes} times a random live \
node publishes the freshest version, and the columns 50 / 95 / 99 % are the mean intervals \
(the worst probe in brackets) until that share of the live nodes other than the origin held \
it. Sessions / node / interval are the sessions nodes started (each also answers about as \
many); bytes are every frame sent with its length prefix (Noise/Yamux framing not modelled). \
Duplicate transfers: entries that crossed a link and were refused as already held; saved by \
InFlight: Want items left out because another session was fetching them. Loss: each \
session cut after a random frame with probability {args.loss}; churn: {args.churn:.0%} of the \
nodes offline at any time (10 intervals on average, state kept).

{table(rows)}
"""


if __name__ == "__main__":
    main()
