"""Every table of docs/*.md that is rendered from a committed output, in one registry.

Each :class:`DocTable` names a marked block of a doc (``<!-- bench:NAME -->`` sections,
``<!-- reproduce:table NAME -->`` tables, docs/robustness.md's table), the committed output it
is rendered from, and its renderer: the same function the benchmark that measured it writes
the block with, so a rerun and a re-render cannot disagree. ``tests/docs/test_docs_tables.py``
re-renders all of them and diffs each against the doc, so a number copied or edited by hand
fails; it also fails on a marked block nobody registered, and on a number-bearing Markdown
table outside every registered block unless :data:`benchmarks.docs_scan.UNCOVERED` lists its section (the known
debt of issue 28: sections still written straight into the doc, with no committed output).

    .venv/bin/python -m benchmarks.docs_tables            # diff every table (exit 1 if any differ)
    .venv/bin/python -m benchmarks.docs_tables --write    # rewrite them from the outputs

A section whose header carries the machine of the run that wrote it *live* (``exact=False``:
the daemon start-up and RSS sections) is checked for containing its rendered tables; rewriting
it is left to its benchmark.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.docs_scan import REFERENCE, UNCOVERED, unmarked_numeric_tables

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BENCHMARKS = DOCS / "benchmarks.md"
REPRODUCTION = DOCS / "reproduction.md"
OUTPUTS = DOCS / "reproduction"


@dataclass(frozen=True)
class DocTable:
    doc: Path
    kind: str  # "bench", "reproduce" or "robustness": how the block is marked
    name: str
    sources: str  # the committed output(s), relative to the repository
    render: Callable[[], str]
    exact: bool = True  # False: the block must contain the rendering (a live header)

    @property
    def key(self) -> str:
        doc = self.doc.relative_to(ROOT) if self.doc.is_relative_to(ROOT) else self.doc
        return f"{doc}#{self.name}"

    def block(self, text: str | None = None) -> str:
        """The block as the doc has it now."""
        text = self.doc.read_text() if text is None else text
        if self.kind == "reproduce":
            from benchmarks.reproduce import marked_tables

            return marked_tables(text)[self.name]
        start, end = markers(self.kind, self.name)
        return text.split(start, 1)[1].split(end, 1)[0]

    def rendered(self) -> str:
        """The block as the committed outputs give it (in the doc's own spacing)."""
        if self.kind == "reproduce":
            from benchmarks.reproduce import MissingOutputsError

            try:
                return self.render().rstrip("\n") + "\n"
            except MissingOutputsError as missing:  # not run: the doc says so, no numbers
                return missing.note()
        if self.kind == "robustness":
            return self.render()
        return self.render().rstrip("\n")  # write_section strips the same

    def diff(self, text: str | None = None) -> str:
        """Empty when the doc's block is what the outputs render; else a unified diff."""
        have, want = self.block(text), self.rendered()
        if have == want or (not self.exact and want in have):
            return ""
        return "\n".join(difflib.unified_diff(have.splitlines(), want.splitlines(),
                                              f"{self.key} (doc)", f"{self.key} (rendered)",
                                              lineterm=""))


def markers(kind: str, name: str) -> tuple[str, str]:
    if kind == "bench":
        return f"<!-- bench:{name} -->\n", f"\n<!-- /bench:{name} -->"
    if kind == "robustness":
        from benchmarks.robustness import MARK_END, MARK_START

        return MARK_START + "\n", MARK_END
    raise ValueError(f"no markers for kind {kind!r}")


def _json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


# ----------------------------------------------------------------- renderers, one per block


def _fleet() -> str:
    from benchmarks.bench_fleet import report

    r = _json(OUTPUTS / "fleet" / "fleet-n32.json")
    # Runs saved before the gap was recorded: the same figure from their timeline (as
    # bench_fleet.render does).
    r.setdefault("widest_sample_gap_s", max(
        y["t"] - x["t"] for x, y in itertools.pairwise(r["timeline"])))
    return report(r, r["lone"], r["torch_baseline"], r["model_bytes"], r["command"],
                  r["machine"], (r["load_before"], r["load_after"]))


def _gossip() -> str:
    from benchmarks.bench_gossip import section

    g = _json(OUTPUTS / "gossip" / "gossip.json")
    return section(g["runs"], argparse.Namespace(**g["settings"]), g["machine"],
                   g.get("provenance"))


def _ray() -> str:
    from benchmarks.bench_ray import render

    return render(_json(OUTPUTS / "ray" / "ray.json"))


def _rss() -> str:
    from benchmarks.bench_rss import report

    return report(_json(OUTPUTS / "daemon-rss.json")["runs"])


def _start() -> str:
    from benchmarks._startup import START_JSON, start_report

    return "\n".join(start_report(_json(START_JSON)))


def _learner() -> str:
    from benchmarks.bench_learner import rendered

    return "\n".join(rendered())


def _encoding() -> str:
    from benchmarks.bench_encoding import table

    return table().rstrip()


def _nat_rebinding() -> str:
    from benchmarks.bench_rebinding import READINGS, render

    return render(_json(READINGS))


def _relay_restart() -> str:
    from benchmarks.bench_relay_restart import READINGS, render

    return render(_json(READINGS))


def _relay_fallback() -> str:
    from benchmarks.bench_relay_fallback import READINGS, render

    return render(_json(READINGS))


def _relay() -> str:
    from benchmarks.bench_relay import READINGS, render

    return render(_json(READINGS))


def _slowlink() -> str:
    from benchmarks.bench_slowlink import READINGS, render

    return render(_json(READINGS))


def _slowlink_delay() -> str:
    from benchmarks.bench_slowlink import READINGS_DELAY, render

    return render(_json(READINGS_DELAY))


def _delaywire() -> str:
    from benchmarks.bench_delaywire import READINGS, render

    return render(_json(READINGS))


def _dcutr() -> str:
    from benchmarks.dcutr_probe import READINGS, render

    return render(_json(READINGS))


def _churn() -> str:
    from benchmarks.bench_churn import CHURN_JSON, render

    return "\n".join(render(_json(CHURN_JSON)))


def _flower() -> str:
    from benchmarks.flower_vs_peerd import RESULT, render

    return "\n".join(render(_json(RESULT)))


def _flower_deploy() -> str:
    from benchmarks.flower_vs_peerd_deploy import RESULT, render

    return "\n".join(render(_json(RESULT)))


def _soak_summary() -> str:
    from benchmarks.soak import summary

    return summary(_json(DOCS / "reliability" / "soak-30min.json"))


def _soak(part: int) -> Callable[[], str]:
    """One table of the committed 30-minute soak's rendering (benchmarks.soak.render's parts:
    1 re-convergence, 3 entries refused, 4 resources, 5 state directories)."""
    def render() -> str:
        from benchmarks.soak import render as soak_render

        return soak_render(_json(DOCS / "reliability" / "soak-30min.json")).split("\n\n")[part]

    return render


def _readings(module: str, path: Path) -> Callable[[], str]:
    """A section that ``module.render`` makes from its readings at ``path``."""
    def render() -> str:
        import importlib

        renderer: Callable[[dict[str, Any]], str] = importlib.import_module(module).render
        return renderer(_json(path))

    return render


#: Sections whose benchmark now writes its readings: registered as soon as a run commits them.
PENDING_READINGS: dict[str, tuple[str, Path]] = {
    "core": ("benchmarks.bench_core", OUTPUTS / "core.json"),
    "robust": ("benchmarks.bench_robust", OUTPUTS / "robust.json"),
    "protocol": ("benchmarks.bench_protocol", OUTPUTS / "protocol.json"),
    "sim": ("benchmarks.bench_sim", OUTPUTS / "sim.json"),
    "knowledge": ("benchmarks.bench_knowledge", OUTPUTS / "knowledge.json"),
    "daemon": ("benchmarks.bench_daemon", OUTPUTS / "daemon.json"),
    "transport": ("benchmarks.bench_transport", OUTPUTS / "transport.json"),
    "simflops": ("benchmarks.bench_simflops", OUTPUTS / "simflops.json"),
}


def _robustness() -> str:
    from benchmarks import robustness as rb

    return rb.table(DOCS / "robustness", rb.ATTACKS, rb.FRACTIONS, rb.RULES, rb.SEEDS,
                    rb.SIGN_FLIP_EXTRA)


def _reproduce(name: str) -> Callable[[], str]:
    def render() -> str:
        from benchmarks.reproduce import RESULTS, Outputs
        from benchmarks.reproduce_tables import TABLES

        return TABLES[name](Outputs(RESULTS))

    return render


def _reproduce_names() -> list[str]:
    from benchmarks.reproduce_tables import TABLES

    return list(TABLES)


def _outputs() -> list[DocTable]:
    """The blocks :mod:`benchmarks.docs_outputs` renders (outputs of tools that print no
    table of their own)."""
    from benchmarks import docs_outputs as do

    rel, rep, res = DOCS / "reliability.md", "docs/reproduction", "docs/results/cordial-mesh"
    tasks = DOCS / "tasks.md"
    return [
        DocTable(rel, "bench", "soak-history", "docs/reliability/soak-30min*.json",
                 do.soak_history),
        DocTable(rel, "bench", "soak-targeted", "docs/reliability/soak-targeted-*.json",
                 do.soak_targeted),
        DocTable(rel, "bench", "cordial-views", "docs/reliability/cordial-views-w64-*.json",
                 do.cordial_views),
        DocTable(REPRODUCTION, "bench", "fedcache-keys", f"{rep}/fedcache-keys-*.json",
                 do.fedcache_keys),
        DocTable(REPRODUCTION, "bench", "cordial-linear", f"{rep}/cordial-linear.json",
                 do.cordial_linear),
        DocTable(REPRODUCTION, "bench", "cordial-pairwise10",
                 f"{rep}/cordial-pairwise10-n*.json", do.cordial_pairwise10),
        DocTable(REPRODUCTION, "bench", "cordial-pairwise10-full",
                 f"{rep}/cordial-pairwise10-full-n*.json", do.cordial_pairwise10_full),
        DocTable(tasks, "bench", "cordial-mesh-mnist", f"{res}/[ci]*-n4-r100.json",
                 lambda: do.cordial_mesh("")),
        DocTable(tasks, "bench", "cordial-mesh-digits", f"{res}/digits-*-n4-r100.json",
                 lambda: do.cordial_mesh("digits-")),
        DocTable(tasks, "bench", "cordial-pairs", f"{res}/integration-runs.json",
                 do.cordial_pairs),
        DocTable(DOCS / "transport.md", "bench", "transport-profile",
                 f"{rep}/transport-profile/*.json", do.transport_profile),
        DocTable(DOCS / "integration.md", "bench", "scenario9",
                 "docs/results/scenario9/scenario9.json", do.scenario9),
    ]


def registry() -> list[DocTable]:
    """Every registered block, in doc order."""
    learners, reliability = DOCS / "learners.md", DOCS / "reliability.md"
    rep = "docs/reproduction"
    tables = [
        DocTable(BENCHMARKS, "bench", "rss", f"{rep}/daemon-rss.json", _rss, exact=False),
        DocTable(BENCHMARKS, "bench", "daemon-start", f"{rep}/daemon-start.json", _start,
                 exact=False),
        DocTable(BENCHMARKS, "bench", "gossip", f"{rep}/gossip/gossip.json", _gossip),
        DocTable(BENCHMARKS, "bench", "fleet", f"{rep}/fleet/fleet-n32.json", _fleet),
        DocTable(BENCHMARKS, "bench", "ray", f"{rep}/ray/ray.json", _ray),
        DocTable(BENCHMARKS, "bench", "learner", f"{rep}/learner*.json", _learner),
        DocTable(BENCHMARKS, "bench", "encoding", "docs/results/encoding/*/*.json", _encoding),
        DocTable(learners, "bench", "flower-vs-peerd",
                 "docs/results/flower-vs-peerd/accuracy-per-round.json", _flower),
        DocTable(learners, "bench", "flower-vs-peerd-deploy",
                 "docs/results/flower-vs-peerd/deployment.json", _flower_deploy),
        *(DocTable(reliability, "bench", name, "docs/reliability/soak-30min.json", _soak(part))
          for part, name in ((1, "soak-convergence"), (3, "soak-entries"),
                             (4, "soak-resources"), (5, "soak-states"))),
        DocTable(reliability, "bench", "soak-summary", "docs/reliability/soak-30min.json",
                 _soak_summary),
        DocTable(reliability, "bench", "nat-rebinding", "docs/reliability/nat-rebinding.json",
                 _nat_rebinding),
        DocTable(reliability, "bench", "relay-restart", "docs/reliability/relay-restart.json",
                 _relay_restart),
        DocTable(reliability, "bench", "relay-fallback", "docs/reliability/relay-fallback.json",
                 _relay_fallback),
        DocTable(reliability, "bench", "churn", "docs/reliability/churn.json", _churn),
        DocTable(DOCS / "transport.md", "bench", "relay",
                 "docs/reproduction/relay/relay-entry.json", _relay),
        DocTable(DOCS / "transport.md", "bench", "dcutr",
                 "docs/reproduction/dcutr/dcutr-cases.json", _dcutr),
        DocTable(DOCS / "transport.md", "bench", "slowlink",
                 "docs/reproduction/slowlink/slowlink.json", _slowlink),
        DocTable(DOCS / "transport.md", "bench", "slowlink-delay",
                 "docs/reproduction/slowlink/slowlink-delay.json", _slowlink_delay),
        DocTable(DOCS / "transport.md", "bench", "delaywire",
                 "docs/reproduction/slowlink/delaywire.json", _delaywire),
        DocTable(DOCS / "robustness.md", "robustness", "robustness-table",
                 "docs/robustness/*.json", _robustness),
        *_outputs(),
    ]
    tables += [DocTable(BENCHMARKS, "bench", name, str(path.relative_to(ROOT)),
                        _readings(module, path))
               for name, (module, path) in PENDING_READINGS.items() if path.exists()]
    tables += [DocTable(REPRODUCTION, "reproduce", name,
                        "docs/results/, docs/reproduction/", _reproduce(name))
               for name in _reproduce_names()]
    return tables


#: Marked ``bench:`` sections whose benchmark writes the doc directly and commits no raw
#: readings (issue 28's debt: each needs its readings committed and a renderer above). Those
#: in :data:`PENDING_READINGS` write them now; :func:`unregistered` drops them once committed.
UNREGISTERED_SECTIONS: frozenset[tuple[str, str]] = frozenset({
    ("docs/benchmarks.md", "core"),
    ("docs/benchmarks.md", "protocol"),
    ("docs/benchmarks.md", "robust"),
})

def unregistered() -> frozenset[tuple[str, str]]:
    """:data:`UNREGISTERED_SECTIONS` less those whose readings are committed by now."""
    done = {("docs/benchmarks.md", n) for n, (_, path) in PENDING_READINGS.items()
            if path.exists()}
    return UNREGISTERED_SECTIONS - done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.docs_tables",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true",
                    help="rewrite every exact block from its committed output")
    ap.add_argument("--uncovered", action="store_true",
                    help="list the sections with numeric tables no registered block covers")
    args = ap.parse_args(argv)
    if args.uncovered:
        for doc in sorted(DOCS.glob("*.md")):
            seen: dict[str, int] = {}
            for heading, _ in unmarked_numeric_tables(doc):
                seen[heading] = seen.get(heading, 0) + 1
            rel = str(doc.relative_to(ROOT))
            for heading, rows in seen.items():
                what = ("not rendered (debt)" if (rel, heading) in UNCOVERED else
                        "reference" if (rel, heading) in REFERENCE else "UNLISTED")
                print(f"{rel}: {heading} ({rows} rows): {what}")
        for rel, name in sorted(unregistered()):
            print(f"{rel}: section bench:{name}: written by its benchmark, no committed "
                  "readings (debt)")
        from benchmarks.docs_provenance import by_pattern

        for pattern, n in by_pattern(registry()).items():
            print(f"{pattern}: {n} output(s) with no provenance record (debt)")
        return 0
    failed = 0
    for table in registry():
        diff = table.diff()
        if not diff:
            continue
        if args.write and table.exact:
            write(table)
            print(f"rewrote {table.key} from {table.sources}")
        else:
            failed += 1
            print(diff)
    return 1 if failed else 0


def write(table: DocTable) -> None:
    text = table.doc.read_text()
    if table.kind == "reproduce":  # every other table renders as it is: they matched
        from benchmarks.reproduce import RESULTS, Outputs, render_report
        from benchmarks.reproduce_tables import TABLES

        table.doc.write_text(render_report(text, TABLES, Outputs(RESULTS)))
        return
    start, end = markers(table.kind, table.name)
    head, rest = text.split(start, 1)
    table.doc.write_text(head + start + table.rendered() + end + rest.split(end, 1)[1])


if __name__ == "__main__":
    sys.exit(main())
