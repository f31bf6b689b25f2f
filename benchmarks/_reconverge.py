"""What the re-convergence benchmarks share (bench_rebinding, bench_relay_restart,
bench_relay_fallback; issue 27): the polling and give-up limits, the target (two round
intervals plus one gossip sweep, the sweep's mean), the median/max summary of a column of
readings, and the command line (measure and write, or only re-render the committed readings
into docs/reliability.md)."""

from __future__ import annotations

import argparse
import json
import statistics
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RELIABILITY = ROOT / "docs" / "reliability.md"
#: How often each member's status is read while waiting (the readings' resolution).
POLL_S = 0.2
#: A member not re-converged this long after the event is recorded as not re-converged (None).
GIVE_UP_S = 60.0
#: Pause between a repetition's re-convergence and the next event (connections settle).
SETTLE_S = 3.0


def target(nodes: Iterable[Any]) -> dict[str, Any]:
    """The readings' common fields: the daemons' round interval (one for all), the gossip
    sweep's mean, the target they make, the polling and give-up limits."""
    from peerd.daemon.gossiping import GOSSIP_INTERVAL_S

    rounds = {tomllib.loads(n.config.read_text())["learning"]["round_interval_s"]
              for n in nodes}
    assert len(rounds) == 1, f"the daemons' round intervals differ: {rounds}"
    round_s = rounds.pop()
    return {"round_interval_s": round_s, "gossip_sweep_s": GOSSIP_INTERVAL_S,
            "target_s": 2 * round_s + GOSSIP_INTERVAL_S, "poll_s": POLL_S,
            "give_up_s": GIVE_UP_S}


def summary(values: list[float | None], give_up: float) -> tuple[str, str, int, bool]:
    """(median, max, n re-converged, all re-converged) as text; a miss counts as give_up."""
    done = [v for v in values if v is not None]
    if not values:
        return "–", "–", 0, False
    worst = [v if v is not None else give_up for v in values]
    top_s = f"{max(worst):.1f}" if len(done) == len(values) else f"> {give_up:.0f}"
    return f"{statistics.median(worst):.1f}", top_s, len(done), len(done) == len(values)


def met(values: list[float | None], target_s: float) -> str:
    """'met' when every reading is there and the largest is within ``target_s``."""
    done = [v for v in values if v is not None]
    return "met" if done and len(done) == len(values) and max(done) <= target_s else "not met"


def main(ap: argparse.ArgumentParser, measure: Callable[[argparse.Namespace], dict[str, Any]],
         render: Callable[[dict[str, Any]], str], readings: Path, mark: str) -> None:
    """Parse ``ap`` (given the benchmark's own options; --no-write and --render are added),
    then measure, print and write the readings and the doc's section, or only re-render."""
    from benchmarks import _provenance
    from benchmarks._report import write_section

    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--render", action="store_true",
                    help="measure nothing: rewrite the section from the committed readings")
    args = ap.parse_args()
    if args.render:
        write_section(mark, render(json.loads(readings.read_text())), RELIABILITY)
        return
    if getattr(args, "repeat", 1) < 1:
        raise SystemExit(f"{ap.prog}: --repeat takes 1 or more, not {args.repeat}")
    started = _provenance.start(ap, args)
    r = measure(args)
    r["provenance"] = started.record()
    md = render(r)
    print(md)
    if not args.no_write:
        readings.write_text(json.dumps(r, indent=1) + "\n")
        write_section(mark, md, RELIABILITY)


def stop_all(running: list[Any], logs: Path | None, *extra: Path) -> None:
    """Stop the daemons (SIGTERM to all first, then each reaped); with ``logs``, copy each
    daemon's log there (as ``<name>.log``) and the ``extra`` files, for reading why a
    repetition took long."""
    import shutil
    import signal

    for node in running:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
    for node in running:
        node.stop()
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        for node in running:
            shutil.copy(node.log, logs / f"{node.name}.log")
        for path in extra:
            if path.exists():
                shutil.copy(path, logs / path.name)


def member_rows(r: dict[str, Any], readings: Sequence[tuple[str, str, bool]]) -> list[str]:
    """Table rows ``| member | reading | median | max | n | target met |`` of ``r``'s
    repetitions (``r["readings"][i]["members"]``), one per member and ``(key, label,
    judged)`` in ``readings``; a key missing from some of a member's readings (made before
    it was recorded) is left out; an unjudged one (a part of the time) says "–"."""
    rows = r["readings"]
    out: list[str] = []
    for member in sorted({m["member"] for row in rows for m in row["members"]}):
        mine = [m for row in rows for m in row["members"] if m["member"] == member]
        for key, what, judged in readings:
            if any(key not in m for m in mine):
                continue
            vals = [m[key] for m in mine]
            med, top, n, _ = summary(vals, r["give_up_s"])
            verdict = met(vals, r["target_s"]) if judged else "–"
            out.append(f"| {member} | {what} | {med} | {top} | {n}/{len(mine)} | {verdict} |")
    return out


def provenance_tail(r: dict[str, Any]) -> list[str]:
    """The section's last lines: its provenance, when the readings carry one."""
    from benchmarks import _provenance

    return ["", _provenance.line(r["provenance"])] if "provenance" in r else []


def cli(doc: str, measure: Callable[[int, Path | None], dict[str, Any]],
        render: Callable[[dict[str, Any]], str], readings: Path, mark: str,
        repeat_help: str) -> None:
    """:func:`main` with the relay benchmarks' options: ``--repeat N`` and ``--logs DIR``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help=repeat_help)
    ap.add_argument("--logs", type=Path, help="copy each daemon's and the relays' logs here")
    main(ap, lambda args: measure(args.repeat, args.logs), render, readings, mark)


def target_text(r: dict[str, Any]) -> str:
    """The section's sentence on the target, from the readings' fields."""
    return (f"Target: 2 × round interval ({r['round_interval_s']:g} s) + 1 gossip sweep "
            f"({r['gossip_sweep_s']:g} s, mean) = **{r['target_s']:g} s**, judged on the max.")


#: The member tables' header (member_rows' columns).
MEMBER_TABLE = ["| member | reading | median (s) | max (s) | n | target met |",
                "|---|---|---:|---:|---:|---|"]
