"""The soak and fault suite, long form (issue 12): real daemons in network namespaces for
``--minutes``, faults on a schedule, invariants after each fault and at the end.

    .venv/bin/python -m benchmarks.soak --minutes 30 --json docs/reliability/soak-30min.json

Needs root and iproute2 (namespaces; mDNS never leaves them). What it runs and checks is
tests/integration/soak.py (the CI test tests/integration/test_soak.py runs a short version);
docs/reliability.md reports the figures of the committed 30-minute run. Exit status 1 when an
invariant failed (the JSON says which).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import _provenance
from peerd.mesh.netns import unavailable
from tests.integration.soak import KINDS, SoakConfig, run_soak, verdict


def _table(head: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join("–" if c is None else str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render(f: dict[str, Any]) -> str:
    """The figures of one run as the Markdown tables of docs/reliability.md."""
    budget = f["convergence_budget_s"]
    conv = _table(["fault", "count", f"re-converged within {budget:g} s", "median s", "max s",
                   "not re-converged"],
                  [[k, c["count"], c["within_budget"], c["median_s"], c["max_s"],
                    c["not_converged"]] for k, c in sorted(f["convergence"].items())])
    e = f["entries"]
    refused = _table(["reason", "kind", "count"],
                     [[r, "rejected", n] for r, n in e["rejected"].items()]
                     + [[r, "dropped (benign)", n] for r, n in e["dropped"].items()])
    res = _table(["daemon", "processes", "longest s", "measured s", "RSS MB first → last (max)",
                  "RSS MB/h", "fds first → last (max)", "fds/h"],
                 [[n, r["processes"], r["longest_process_s"], r["measured_s"],
                   f"{r['rss_mb_first']} → {r['rss_mb_last']} ({r['rss_mb_max']})",
                   r["rss_mb_per_h"], f"{r['fds_first']} → {r['fds_last']} ({r['fds_max']})",
                   r["fds_per_h"]] for n, r in f["resources"].items()])
    states = _table(["daemon", "entries on disk", "restored", "own entry", "round", "version",
                     "quarantined", "ok"],
                    [[n, s["entries_on_disk"], s["restored"], s["own_entry"], s["round"],
                      s["version"], len(s["quarantined"]), s["ok"]]
                     for n, s in f["states"].items()])
    return "\n\n".join([
        f"duration {f['duration_s']} s, {f['daemons']} daemons, faults "
        + ", ".join(f"{k} {n}" for k, n in sorted(f["faults_by_kind"].items())),
        conv, f"accepted {e['accepted']}", refused, res, states,
        f"corrupt states {f['corrupt_states']}, round/version regressions "
        f"{len(f['regressions'])}, cached-version regressions {len(f['cache_regressions'])}, "
        f"non-members in peer tables {len(f['non_member_peer_rows'])}, verdict {f['verdict']}",
        summary(f),
    ])


def _n(x: float) -> str:
    return f"{x:,}"


def summary(f: dict[str, Any]) -> str:
    """The run's headline figures (docs/reliability.md, "Results of the committed run")."""
    c = f["config"]
    kinds = f["faults_by_kind"]
    held = kinds.get("stranger_flood_held", 0)
    injected = sum(n for k, n in kinds.items() if k != "stranger_flood_held")
    every = f["duration_s"] / kinds["churn"] if kinds.get("churn") else None
    parts = []
    for k, n in sorted(kinds.items(), key=lambda kv: (kv[0] != "churn", kv[0])):
        if k == "stranger_flood_held":
            continue
        extra = ""
        if k == "churn" and every is not None:
            extra = f" (one every {every:.0f} s on average)"
        elif k == "stranger_flood":
            extra = f" ({_n(n * c['flood'])} stranger connections)"
        elif k == "mdns_wave":
            extra = f" ({_n(n * c['wave'])} fake instances)"
        parts.append(f"{k} {n}{extra}")
    faults = f"{injected}: " + ", ".join(parts)
    if held:
        faults += f"; and {held} re-convergence checks while {c['flood']} strangers were held"
    states = f["states"]
    quarantined = sum(len(s["quarantined"]) for s in states.values())
    restarts = f["restart_s"]
    # The daemon that ran longest in one process is the one whose slopes mean something.
    name, res = max(f["resources"].items(),
                    key=lambda kv: (-kv[1]["processes"], kv[1]["measured_s"]))
    rows = [
        ("duration", f"{_n(round(f['duration_s']))} s ({f['duration_s'] / 60:.1f} min) of "
                     "faults, after start-up"),
        ("faults injected", faults),
        ("corrupt states", f"**{f['corrupt_states']}** ({restarts['count']} restarts restored "
                           f"with {f['refused_on_restore']} refused; {len(states)} final state "
                           f"directories verified, {quarantined} quarantined)"),
        ("regressions of round / version / published version",
         f"**{len(f['regressions'])}** ({_n(f['samples'])} samples, also across the "
         f"{restarts['count']} SIGKILLs)"),
        ("regressions of a cached version", f"**{len(f['cache_regressions'])}**"),
        ("non-members ever in a peer table", f"**{len(f['non_member_peer_rows'])}** (at most "
                                              f"{f['max_peer_rows']} rows)"),
        ("daemon exit codes at the end (SIGTERM)",
         ", ".join(str(v) for v in f["exit_codes"].values())),
        ("restart after SIGKILL to serving status with its entry",
         f"median {restarts['median']} s, max {restarts['max']} s"),
        (f"RSS slope, {name} ({res['processes']} process, {_n(res['measured_s'])} s measured)",
         f"**{res['rss_mb_per_h']:+g} MB/h** ({res['rss_mb_first']} → {res['rss_mb_last']} MB)"),
        (f"open fds slope, {name}", f"**{res['fds_per_h']:+g} fds/h** ({res['fds_first']} → "
                                    f"{res['fds_last']}; {res['fds_max']} at most)"),
        ("verdict", str(f["verdict"])),
    ]
    table = _table(["figure", "value"], [list(r) for r in rows])
    if "provenance" in f:
        from benchmarks import _provenance as prov

        table += "\n\n" + prov.line(f["provenance"])
    return table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--daemons", type=int, default=4)
    p.add_argument("--round-interval", type=float, default=5.0)
    p.add_argument("--flood", type=int, default=300, help="stranger connections held")
    p.add_argument("--wave", type=int, default=1500, help="fake mDNS instances")
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"fault kinds to inject, comma-separated (default: all: {','.join(KINDS)})")
    p.add_argument("--no-churn", action="store_true", help="no SIGKILL/restart among them")
    p.add_argument("--diagnose", action="store_true", help="record each node's TCP "
                   "connections (ss -tnoi) around partitions and address changes")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--render", type=Path, help="print a run's JSON as the tables of "
                   "docs/reliability.md, and run nothing")
    args = p.parse_args()
    if args.render is not None:
        print(render(json.loads(args.render.read_text())))
        return 0
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if not kinds or not set(kinds) <= set(KINDS):
        print(f"soak: --kinds takes some of {', '.join(KINDS)}", file=sys.stderr)
        return 2
    reason = unavailable()
    if reason is not None:
        print(f"soak: {reason}", file=sys.stderr)
        return 2
    started = _provenance.start(p, args)
    cfg = SoakConfig(minutes=args.minutes, daemons=args.daemons,
                     round_interval_s=args.round_interval, flood=args.flood, wave=args.wave,
                     seed=args.seed, kinds=kinds, churn=not args.no_churn,
                     diagnose=args.diagnose)
    with tempfile.TemporaryDirectory(prefix="peerd-soak-") as tmp:
        figures = run_soak(cfg, Path(tmp))
    problems = verdict(figures)
    figures["verdict"] = problems or "ok"
    figures["provenance"] = started.record()
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps({k: figures[k] for k in ("duration_s", "faults_by_kind", "convergence",
                                              "entries", "corrupt_states", "regressions",
                                              "verdict")}, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
