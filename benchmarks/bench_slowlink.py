"""One large entry over a slow, lossy WAN link (issue 27, items 4-5): time and bytes at
float32, float16 and int8, and a float32 transfer cut mid-way that resumes.

    sudo .venv/bin/python -m benchmarks.bench_slowlink [--mb 16] [--repeat 2]
        [--delay-ms 0] [--no-write] [--render]

The set-up is tests/net/test_slowlink.py's (tests/net/slowlink.py): two peerd transports
(libp2p, Noise, Yamux) running peerd's gossip sessions, the receiver on the public segment of
the namespace WAN (tests/net/wan.py), the sender behind site a's NAT router, whose uplink is
shaped both ways to ``--rate-mbit`` with ``--loss-pct`` loss (tbf and an iptables statistic
DROP) and, with ``--delay-ms``, delayed that much each way (the WAN's userspace delay line,
tests/net/delaywire.py: no netem needed; see docs/transport.md). Each case sends
the same ``--mb`` MB of float32 parameters, signed in the case's encoding, once per
repetition, each in a fresh WAN with fresh processes. The cut case takes the uplink down
(every forwarded packet dropped) for ``--cut-s`` seconds once the receiver holds 40 % of
the entry frame; both ends give up on the connection, the sender dials again, and the new
session asks for the rest (resume/v1). Per run: the entry frame's bytes, every byte that
reached the receiver's sessions, the sessions it took, the resume counters, and the wall time
from the first session's start to the end of the one that cached the entry (a cut included).

The readings (with their provenance) go to docs/reproduction/slowlink/slowlink.json and the
section of docs/transport.md between the ``<!-- bench:slowlink -->`` markers is rendered from
them (benchmarks/docs_tables.py and tests/docs re-render and diff it); a run with a delay
goes to slowlink-delay.json and the ``slowlink-delay`` section instead, so the delay-free
readings stay beside it (the default, 0, repeats their command as recorded).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
READINGS = ROOT / "docs" / "reproduction" / "slowlink" / "slowlink.json"
#: A run with ``--delay-ms`` > 0: its own readings and section.
READINGS_DELAY = READINGS.with_name("slowlink-delay.json")
TRANSPORT = ROOT / "docs" / "transport.md"
MARK = "slowlink"
MARK_DELAY = "slowlink-delay"
#: (case, encoding, cut): the same entry each time.
CASES = (("float32", "float32", False), ("float16", "float16", False),
         ("int8", "int8", False), ("float32, cut", "float32", True))
#: The cut begins once the receiver's spool file holds this share of the entry frame.
CUT_AT = 0.4


def _one(mb: float, encoding: str, cut: bool, link: Any, cut_s: float) -> dict[str, Any]:
    from tests.net.slowlink import run
    from tests.net.wan import wan

    with tempfile.TemporaryDirectory() as d, wan((1, 1), 1, link=link) as w:
        got = run(w, Path(d), mb=mb, encoding=encoding, cut_at=CUT_AT if cut else None,
                  cut_s=cut_s)
    last = got.last
    return {"entry_bytes": got.entry_bytes, "bytes_in": got.bytes_in,
            "wall_s": round(got.wall_s, 3), "sessions": len(got.receiver),
            "failed_sessions": sum(s["error"] is not None for s in got.receiver),
            "cut_at_bytes": got.cut_at_bytes, "resumed": last["resumed"],
            "bytes_not_resent": last["bytes_not_resent"],
            "last_session_bytes": last["bytes_in"]}


def measure(mb: float, repeat: int, rate_mbit: float, loss_pct: float,
            cut_s: float, delay_ms: float = 0.0) -> dict[str, Any]:
    from tests.net.wan import Link, skip_reason

    link = Link(delay_ms=delay_ms, rate_mbit=rate_mbit, loss_pct=loss_pct)
    reason = skip_reason(link)
    if reason is not None:
        raise SystemExit(f"bench_slowlink: {reason}")
    cases = []
    for name, encoding, cut in CASES:
        runs = []
        for i in range(repeat):
            runs.append(_one(mb, encoding, cut, link, cut_s))
            print(f"{name} #{i}: {runs[-1]}", file=sys.stderr, flush=True)
        cases.append({"case": name, "encoding": encoding, "cut": cut, "runs": runs})
    return {"mb": mb, "rate_mbit": rate_mbit, "loss_pct": loss_pct, "delay_ms": delay_ms,
            "cut_s": cut_s,
            "cut_at": CUT_AT, "repeat": repeat, "cases": cases}


def render(r: dict[str, Any]) -> str:
    """The doc's section from one run's readings (medians over the repetitions)."""
    base = next(c for c in r["cases"] if c["case"] == "float32")
    base_s = statistics.median(x["wall_s"] for x in base["runs"])
    base_b = statistics.median(x["bytes_in"] for x in base["runs"])
    delay_ms = r.get("delay_ms", 0.0)  # readings from before --delay-ms had none
    delay = (f"{delay_ms:g} ms delay each way, by the WAN's delay line" if delay_ms
             else "no delay")
    lines = [
        f"One entry of {r['mb']:g} MB of float32 parameters, sender behind site a's NAT, "
        f"uplink {r['rate_mbit']:g} Mbit/s with {r['loss_pct']:g} % loss each way "
        f"({delay}), median of {r['repeat']} runs each. *Bytes in*: every byte that reached the "
        "receiver's sessions (all frames, all sessions); *time*: first session's start to "
        "the end of the one that cached the entry; *goodput*: bytes in over time.",
        "",
        "| case | entry frame (B) | bytes in (B) | vs float32 | sessions | time (s) "
        "| vs float32 | goodput (Mbit/s) | re-sent after the cut (B) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in r["cases"]:
        runs = c["runs"]
        wall = statistics.median(x["wall_s"] for x in runs)
        got = statistics.median(x["bytes_in"] for x in runs)
        frame = statistics.median(x["entry_bytes"] for x in runs)
        sessions = "/".join(str(x["sessions"]) for x in runs)
        resent = ("–" if not c["cut"] else
                  "/".join(f"{x['last_session_bytes']:,} (kept {x['bytes_not_resent']:,})"
                           for x in runs))
        lines.append(f"| {c['case']} | {frame:,.0f} | {got:,.0f} | {base_b / got:.2f}× "
                     f"| {sessions} | {wall:.1f} | {base_s / wall:.2f}× "
                     f"| {got * 8 / wall / 1e6:.1f} | {resent} |")
    cut = next(c for c in r["cases"] if c["cut"])
    extra = ", ".join(f"{x['bytes_in'] - base_b:+,.0f} B" for x in cut["runs"])
    lines += ["", (f"The cut case's link was down {r['cut_s']:g} s of its time, from when the "
                   f"receiver held {r['cut_at']:.0%} of the frame; *re-sent after the cut* is "
                   "the resumed session's bytes in, and *kept* what the receiver had spooled "
                   "and did not fetch again (`bytes_not_resent`), per run. Resumed in "
                   f"{sum(x['resumed'] for x in cut['runs'])} of {len(cut['runs'])} runs; "
                   "bytes in over all its sessions, beside the uncut float32 transfer's: "
                   f"{extra}.")]
    if "provenance" in r:
        from benchmarks import _provenance

        lines += ["", _provenance.line(r["provenance"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    from benchmarks import _provenance
    from benchmarks._report import write_section

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=16.0, help="float32 MB of the entry")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--rate-mbit", type=float, default=20.0)
    ap.add_argument("--loss-pct", type=float, default=1.0)
    ap.add_argument("--cut-s", type=float, default=8.0)
    ap.add_argument("--delay-ms", type=float, default=0.0,
                    help="each way; > 0 writes slowlink-delay.json and its section")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--render", action="store_true", help="re-render from the readings only")
    args = ap.parse_args()
    if args.render:
        for mark, readings in ((MARK, READINGS), (MARK_DELAY, READINGS_DELAY)):
            if readings.exists():
                write_section(mark, render(json.loads(readings.read_text())), TRANSPORT)
        return
    mark, readings = (MARK_DELAY, READINGS_DELAY) if args.delay_ms > 0 else (MARK, READINGS)
    started = _provenance.start(ap, args)
    r = measure(args.mb, args.repeat, args.rate_mbit, args.loss_pct, args.cut_s,
                args.delay_ms)
    r["provenance"] = started.record()
    if not args.no_write:  # the readings first: a renderer's bug must not lose a run
        readings.parent.mkdir(parents=True, exist_ok=True)
        readings.write_text(json.dumps(r, indent=1) + "\n")
    md = render(r)
    print(md)
    if not args.no_write:
        write_section(mark, md, TRANSPORT)


if __name__ == "__main__":
    main()
