"""Renderers for the tables of docs/*.md whose committed output comes from a tool that does
not render its own table (``peerd sim cordial``, ``peerd demo``, ``peerd.learn.keys``, the
targeted soak runs, the cordial-views attack, the transport profile). Each reads only the
committed output, so :mod:`benchmarks.docs_tables` can re-render and diff the doc's block
(issue 28 item 2): a number copied by hand, or an output replaced without re-rendering, fails
``tests/docs/test_docs_tables.py``.

Constants here are the *papers'* figures (reference values set beside a measurement), never a
measurement.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
OUTPUTS = DOCS / "reproduction"


def _json(path: Path) -> dict[str, Any]:
    # NaN and Infinity are Python's JSON extension; the cordial-views losses hold them.
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _table(head: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    rule = align or ["---"] * len(head)
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _provenance(data: dict[str, Any]) -> str:
    from benchmarks import _provenance as prov

    return prov.line(data["provenance"])


# ------------------------------------------------------------- FedCache: sample keys


KEY_SPACES = (("raw_cosine", "raw input cosine"), ("centred_cosine", "centred input cosine"),
              ("keys_16", "keys, 16-d"), ("keys_64", "**keys, 64-d (default)**"),
              ("keys_256", "keys, 256-d"))


def fedcache_keys() -> str:
    """docs/reproduction.md, "Sample keys": label agreement / kNN accuracy per space."""
    runs = [_json(OUTPUTS / f"fedcache-keys-{d}.json") for d in ("fashion-mnist", "mnist")]
    rows = []
    for key, label in KEY_SPACES:
        cells = [f"{100 * r['results'][key]['label_agreement']:.2f} % / "
                 f"{100 * r['results'][key]['knn_accuracy']:.2f} %" for r in runs]
        if label.startswith("**"):  # the default, in bold as its row label
            cells = [f"**{c}**" for c in cells]
        rows.append([label, *cells])
    table = _table(["space", "FashionMNIST agreement / kNN", "MNIST agreement / kNN"], rows)
    return "\n\n".join([table, *(f"{r['dataset']}: " + _provenance(r) for r in runs
                                  if "provenance" in r)])


# ------------------------------------------------------------- cordial learning (§6.1, §6.2.1)


#: §6.1's text: the median ratio after 20,000 iterations for two of its six configurations;
#: the other four "between" them.
PAPER_LINEAR_MEDIAN = {(8, "gaussian"): "0.36 %", (32, "laplace"): "1.4 %"}


def cordial_linear() -> str:
    """docs/reproduction.md, "Linear model (§6.1)": one row per configuration."""
    rows = []
    data = _json(OUTPUTS / "cordial-linear.json")
    for c in data["configs"]:
        runs = c["runs"]
        paper = PAPER_LINEAR_MEDIAN.get((c["n"], c["distribution"]), "between 0.36 and 1.4 %")
        rows.append([str(c["n"]), c["distribution"], str(runs),
                     f"{100 * c['median_ratio_final']:.2f} %",
                     f"{100 * c['max_ratio_final']:.2f} %", paper,
                     f"{c['lower_at_20']}/{runs}", f"{c['lower_from_140_on']}/{runs}",
                     f"{c['slope']:.3f}", str(c["psd_repaired_runs"]), f"{c['wall_s']:.0f} s"])
    table = _table(["N", "inputs", "runs", "median ratio @ 20,000", "largest ratio",
                    "paper median", "lower @ 20", "lower from 140 on", "slope 2,000–20,000",
                    "R repaired", "wall"], rows)
    return "\n\n".join([table, _provenance(data)]) if "provenance" in data else table


#: The paper's Table 2 (P = 25): test accuracy of cordial agents with the messages removed.
PAPER_MESSAGES_REMOVED = {2: "0.76", 4: "0.684", 6: "0.651"}


def cordial_pairwise10(stem: str = "cordial-pairwise10") -> str:
    """docs/reproduction.md, "Pairwise-10 composite MNIST (§6.2.1), P = 25": the runs in
    ``<stem>-n{2,4,6}.json`` (the 200-epoch runs, or ``cordial-pairwise10-full``'s 2,250)."""
    rows = []
    records = []
    for n in (2, 4, 6):
        data = _json(OUTPUTS / f"{stem}-n{n}.json")
        if "provenance" in data:
            records.append(f"N = {n}: " + _provenance(data))
        epochs = data["settings"]["epochs"]
        for c in data["configs"]:
            cordial = c["method"] == "cordial"
            removed = f"{c['median_accuracy_messages_removed']:.3f}" if cordial else "–"
            best = [int(e) for e in c.get("best_epoch", [])]
            chosen = "–" if not best else str(best[0]) if min(best) == max(best) \
                else f"{min(best)}–{max(best)}"
            rows.append([str(n), c["method"], str(c["runs"]), str(epochs), chosen,
                         f"{c['median_test_loss']:.3g}", f"{c['median_test_accuracy']:.3f}",
                         removed, f"{c['paper_median_test_loss']:g}",
                         f"{c['paper_median_test_accuracy']:.3f}",
                         PAPER_MESSAGES_REMOVED[n] if cordial else "–"])
    table = _table(["N", "method", "runs", "epochs", "selected epoch",
                    "median test loss / agent", "median accuracy", "messages removed",
                    "paper loss (2,250 epochs, 30 runs)", "paper accuracy",
                    "paper messages removed"], rows)
    return "\n\n".join([table, *records])


def cordial_pairwise10_full() -> str:
    """The same at the paper's 2,250 epochs, one draw."""
    return cordial_pairwise10("cordial-pairwise10-full")


# ------------------------------------------------------------- cordial daemons (docs/tasks.md)


MESH = DOCS / "results" / "cordial-mesh"


def cordial_mesh(prefix: str) -> str:
    """docs/tasks.md, "Measured: 4 daemons": ``peerd demo --mode cordial --json`` with and
    without ``--isolated`` (``prefix`` "" for MNIST, "digits-" for the digits)."""
    means = {}
    rows = []
    records = []
    for name, label in (("cordial", "cordial (views used)"),
                        ("isolated", "isolated (`--isolated`)")):
        data = _json(MESH / f"{prefix}{name}-n4-r100.json")
        nodes = data["nodes"]
        if "provenance" in data:
            records.append(f"{name.capitalize()}: " + _provenance(data))
        acc = [n["test_accuracy"] for n in nodes]
        means[name] = statistics.fmean(acc)
        rows.append([label, ", ".join(str(n["round"]) for n in nodes),
                     ", ".join(f"{a:.3f}" for a in acc), f"**{means[name]:.3f}**"])
    gain = 100 * (means["cordial"] - means["isolated"])
    return (_table(["run", "rounds (per node)", "test accuracy per agent", "mean"], rows)
            + f"\n\nWith views, the mean test accuracy is **{gain:.1f} points** above the same "
            "four daemons in isolation." + "".join(f"\n\n{r}" for r in records))


# ------------------------------------------------------------- docs/reliability.md


RELIABILITY = DOCS / "reliability"
TARGETED = (("before mend 9", "soak-targeted-before-reconnect.json"),
            ("with mend 9", "soak-targeted-after-reconnect.json"))


def soak_targeted() -> str:
    """docs/reliability.md, "Partitions and address changes": the two 5-minute targeted
    soak runs (``benchmarks.soak --kinds partition,address_change --no-churn --diagnose``)."""
    rows = []
    for label, name in TARGETED:
        f = _json(RELIABILITY / name)
        row = [f"{label} ([json](reliability/{name}))"]
        for kind in ("partition", "address_change"):
            c = f["convergence"][kind]
            row += [f"{c['within_budget']} of {c['count']}", f"{c['median_s']:g}",
                    f"{c['max_s']:g}"]
        rows.append(row)
    minutes = {_json(RELIABILITY / n)["config"]["minutes"] for _, n in TARGETED}
    budget = {_json(RELIABILITY / n)["convergence_budget_s"] for _, n in TARGETED}
    (m,), (b,) = minutes, budget  # one setting for both, or the table's header would lie
    return _table([f"targeted run ({m:g} min, no churn)", f"partitions within {b:g} s",
                   "median s", "max s", f"address changes within {b:g} s", "median s",
                   "max s"], rows)


def _sci(v: float) -> str:
    """A loss as the doc writes it: 3 significant digits, ``7.13e-4`` / ``4.3e136`` beyond
    [0.01, 10⁴), NaN as ``NaN``."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Inf" if v > 0 else "-Inf"
    if v != 0 and not 1e-2 <= abs(v) < 1e4:
        mantissa, exp = f"{v:.2e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exp)}"
    return f"{v:.3g}"


ATTACKS = {"clean": "none (clean)", "+10 by M": "M, +10", "+1000 by M": "M, +1000",
           "+10 by agent 1": "agent 1's key, +10", "+1000 by agent 1": "agent 1's key, +1000"}


def _restart(line: str) -> str:
    if line.startswith("restored"):
        return "restored"
    reach = re.search(r"reaches \|([^|]+)\|", line)
    if reach:
        return f"quarantined: Λ reaches {_sci(float(reach.group(1)))}"
    if "NaN or Inf" in line:
        return "quarantined: NaN or Inf in Λ"
    return line


def cordial_views() -> str:
    """docs/reliability.md, "Cordial views": agent 0's held-out loss per attack, from the
    unfixed and the fixed runs of ``benchmarks.cordial_views --json``."""
    unfixed = _json(RELIABILITY / "cordial-views-w64-unfixed.json")
    fixed = _json(RELIABILITY / "cordial-views-w64-fixed.json")
    by_label = {c["label"]: c for c in fixed["cases"]}
    clean = by_label["clean"]["losses"]
    rounds = fixed["rounds"]
    rows = []
    for u in unfixed["cases"]:
        f = by_label[u["label"]]
        same = " (identical to clean)" if f["losses"] == clean and u["label"] != "clean" \
            else ""
        refused = ", ".join(f"`{r}` ×{n}" for r, n in f["refused"].items()) or "–"
        rows.append([ATTACKS[u["label"]], f"{_sci(u['losses'][1])} → {_sci(u['losses'][-1])}",
                     _sci(f["losses"][-1]) + same, refused, _restart(u["restart"])])
    return "\n\n".join([
        _table(["attack", f"unfixed: 2nd round → {rounds}th",
                f"fixed: round {rounds} (clean: {_sci(clean[-1])})", "refused (fixed)",
                "restart after the unfixed run"], rows),
        "Unfixed: " + _provenance(unfixed), "Fixed: " + _provenance(fixed)])


# ------------------------------------------------------------- docs/transport.md


PROFILE = OUTPUTS / "transport-profile"
#: The alternated runs without a profiler, in the order they ran (on, off, on, off).
ALTERNATED = ("alternated-1-on", "alternated-1-off", "alternated-2-on", "alternated-2-off")


def transport_profile() -> str:
    """docs/transport.md, "Where the time of a 44 MB transfer goes": ``benchmarks.
    profile_transport --json`` with py-libp2p's own path ("before", ``--unmended``) and with
    the mends ("after"), plus the alternated runs without a profiler."""
    med = statistics.median
    runs = {"before": _json(PROFILE / "unmended.json"), "after": _json(PROFILE / "mended.json")}
    alt = {name: _json(PROFILE / f"{name}.json") for name in ALTERNATED}
    cols = [("a", "before"), ("a", "after"), ("b", "before"), ("b", "after")]
    key = {"a": "cpu_a_s", "b": "cpu_b_s"}

    def per_session(side: str, when: str, name: str) -> float:
        r = runs[when]
        total: float = r["profiled"]["totals"][side].get(name, 0.0)
        sessions: int = r["sessions"]
        return total / sessions

    rows = [["process CPU, no profiler (s)",
             *(f"{med(runs[w][key[s]]):.3f}" for s, w in cols)],
            ["the same, alternated runs without a profiler (s) ¹",
             *(", ".join(f"{med(a[key[s]]):.2f}" for a in alt.values()
                         if a["unmended"] == (w == "before")) for s, w in cols)]]
    profiled = runs["after"]["profiled"]
    skipped = {profiled["idle"], *profiled["counted"]}
    for name in profiled["categories"]:
        if name == profiled["idle"]:  # waiting in epoll is not CPU spent
            continue
        rows.append([f"{name} (s)", *(f"{per_session(s, w, name):.3f}" for s, w in cols)])
    rows.append(["all, under cProfile (s)", *(
        f"{sum(per_session(s, w, n) for n in runs[w]['profiled']['totals'][s] if n not in skipped):.3f}"
        for s, w in cols)])
    for name in profiled["counted"]:
        rows.append([f"{name}, per session", *(f"{per_session(s, w, name):.0f}"
                                                for s, w in cols)])
    sessions = {r["sessions"] for r in runs.values()}
    alt_sessions = {a["sessions"] for a in alt.values()}
    loads = [x for a in alt.values() for x in (a["load_before"], a["load_after"])]
    return "\n\n".join([
        _table([f"per {runs['after']['mb']:g} MB session", "A, before", "A, after",
                "B, before", "B, after"], rows, ["---", "---:", "---:", "---:", "---:"]),
        f"Medians of {'/'.join(map(str, sorted(sessions)))} sessions after a warm-up; "
        f"the profiled rows are per session of a second, profiled pass. "
        f"¹ Medians of {'/'.join(map(str, sorted(alt_sessions)))} sessions each, run on, off, "
        f"on, off (`--no-profile`, load average {min(loads):.1f} to {max(loads):.1f}).",
        "Before: " + _provenance(runs["before"]), "After: " + _provenance(runs["after"]),
        *(f"Alternated ({name.rsplit('-', 1)[1]}): " + _provenance(a)
          for name, a in alt.items())])


#: The kept 30-minute soak runs, newest first, and the code each measured. Only the newest
#: output records its commit (provenance); for the older ones the label is what the commit
#: that added the output said it measured.
SOAKS = (("soak-30min.json", None),
         ("soak-30min-069eaeb.json", None),
         ("soak-30min-9e18726.json", "9e18726"),
         ("soak-30min-533bb07.json", "533bb07 + mend 9"),
         ("soak-30min-before-reconnect.json", "15fd3e0 (before mend 9)"),
         ("soak-30min-before-member-backoff.json", "59842c9 (before the backoff cap)"))


def _converged(f: dict[str, Any], kind: str) -> str:
    c = f["convergence"][kind]
    return f"{c['within_budget']} of {c['count']} ({c['median_s']:g} / {c['max_s']:g})"


def soak_history() -> str:
    """docs/reliability.md: the kept 30-minute soak runs side by side (same seed and
    schedule), each from its committed output."""
    rows = []
    for name, label in SOAKS:
        f = _json(RELIABILITY / name)
        commit = f"`{f['provenance']['commit'][:7]}`" if "provenance" in f else str(label)
        kinds = f["faults_by_kind"]
        node0 = f["resources"]["node0"]
        rows.append([
            f"[{name}](reliability/{name})", commit,
            str(sum(n for k, n in kinds.items() if k != "stranger_flood_held")),
            str(f["corrupt_states"]),
            f"{len(f['regressions'])} + {len(f['cache_regressions'])} ({f['samples']:,})",
            _converged(f, "partition"), _converged(f, "address_change"),
            _converged(f, "churn"), f"{f['restart_s']['median']:g} / {f['restart_s']['max']:g}",
            f"{f['entries']['accepted']:,}",
            f"{node0['rss_mb_per_h']:+g} ({node0['rss_mb_first']} → {node0['rss_mb_last']})",
            f"{node0['fds_per_h']:+g}", str(f["status_failures"]), str(f["verdict"])])
    budget = {_json(RELIABILITY / n)["convergence_budget_s"] for n, _ in SOAKS}
    (b,) = budget
    return _table(["output", "code", "faults", "corrupt states",
                   "regressions: round/version + cached (samples)",
                   f"partitions within {b:g} s (median / max s)",
                   f"address changes within {b:g} s (median / max s)",
                   f"churn within {b:g} s (median / max s)",
                   "restart after SIGKILL median / max s", "entries accepted",
                   "node0 RSS MB/h (first → last MB)", "node0 fds/h",
                   "status polls with no socket", "verdict"], rows)


INTEGRATION_RUNS = MESH / "integration-runs.json"


def cordial_pairs() -> str:
    """docs/tasks.md: ``benchmarks.cordial_mesh_runs`` (docs/results/cordial-mesh/
    integration-runs.json), the two-agent test's agents 0 and 1 with and without views at
    its last round, per run; then the four-daemon mesh's means."""
    data = _json(INTEGRATION_RUNS)
    rows = []
    for run in data["runs"]:
        if "pairs" not in run:  # the test printed nothing: say so, never drop the run
            rows.append([str(run["run"]), "no result", "no result", "–",
                         f"{run['wall_s']:.0f} s"])
            continue
        pairs = run["pairs"]
        gap = 100 * statistics.fmean(w - wo for w, wo in pairs)
        rows.append([str(run["run"]), *(f"{w:.3f} / {wo:.3f}" for w, wo in pairs),
                     f"{gap:+.1f} points", f"{run['wall_s']:.0f} s"])
    out = _table(["run", "agent 0 with / without views", "agent 1 with / without views",
                  "mean gap", "time"], rows)
    four = data.get("four")
    if four is not None:
        out += ("\n\nFour daemons, " + (
            f"{four['rounds']} rounds: mean test accuracy **{four['with_views']:.3f}** with "
            f"views against **{four['isolated']:.3f}** isolated ({four['wall_s']:.0f} s, "
            f"`{four['pytest']}`)." if "with_views" in four else "no result."))
    return out + "\n\n" + _provenance(data)


# ------------------------------------------------------------- docs/integration.md


SCENARIO9 = DOCS / "results" / "scenario9" / "scenario9.json"


def scenario9() -> str:
    """docs/integration.md, "Scenario 9 numbers": ``benchmarks.scenario9 --json``."""
    data = _json(SCENARIO9)
    labels = {"mesh": "mesh (Cached-DFL)", "isolated": "isolated"}
    rows = []
    for read in data["reads"]:
        acc = [n["val_accuracy"] for n in read["nodes"]]
        rows.append([str(read["read_at"]), labels[read["group"]], *(f"{a:.3f}" for a in acc),
                     f"**{statistics.fmean(acc):.3f}**"])
    names = [n["name"] for n in data["reads"][0]["nodes"]]
    return _table(["rounds", "group", *names, "mean"], rows) + "\n\n" + _provenance(data)
