"""Stranger churn against a real daemon, in full (issue 24, item 1; the CI form is
tests/integration/test_stranger_churn.py with 1,500).

    .venv/bin/python -m benchmarks.bench_churn --strangers 5000 --write

starts one `peerd run` on loopback (mDNS off, task digits, 3 local steps a round) and sends
``--strangers`` fresh libp2p identities through it (tests/net/churn.py: whole py-libp2p hosts,
each dialling once, saying Hello, reading the refusal), ``--concurrency`` at a time. After
every ``--step`` of them it reads the daemon's RSS and open fds (/proc), its round and its
py-libp2p table counts (`peerd status --json`'s "libp2p"); at the end a member's session over
a fresh dial is timed. ``--write`` stores the readings, with the commit and this command, in
docs/reliability/churn.json and renders the section of docs/reliability.md between the
``<!-- bench:churn -->`` markers (tests/docs/test_churn_doc.py re-renders it).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import _provenance
from benchmarks._report import commit, machine
from peerd.store.keyfile import read_private_key
from tests.integration.hostile import Target, hostile_peer
from tests.integration.mesh import STARTUP_TIMEOUT_S, make_fleet, wait_for, write_overrides
from tests.integration.soak_metrics import open_fds, rss_mb
from tests.net.churn import churn_in_thread

ROOT = Path(__file__).resolve().parent.parent
CHURN_JSON = ROOT / "docs" / "reliability" / "churn.json"
RELIABILITY = ROOT / "docs" / "reliability.md"
MARK = "churn"


def run(strangers: int, step: int, concurrency: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        a, b = make_fleet(Path(tmp), 2, base_port=27470, learning={"local_steps": 3})
        write_overrides(a.config, network={"static_peers": []})
        a.start()
        try:
            wait_for(lambda: (a.status() or {}).get("node", {}).get("published_version")
                     is not None, STARTUP_TIMEOUT_S, "the daemon to publish", [a])
            assert a.proc is not None
            pid = a.proc.pid
            s0 = a.status() or {}
            fleet = bytes.fromhex(s0["node"]["fleet"])
            addr = f"/ip4/127.0.0.1/tcp/{a.port}"

            def reading(done: int, seconds: float, outcomes: dict[str, int]) -> dict[str, Any]:
                s = a.status() or {}
                return {"strangers": done, "seconds": round(seconds, 1),
                        "rss_mb": rss_mb(pid), "fds": open_fds(pid),
                        "round": s.get("node", {}).get("round"), "libp2p": s.get("libp2p"),
                        "alive": a.alive(), "outcomes": outcomes}

            readings = [reading(0, 0.0, {})]
            done, elapsed = 0, 0.0
            totals: dict[str, int] = {}
            while done < strangers:
                n = min(step, strangers - done)
                seen = churn_in_thread(fleet, a.id, addr, n, concurrency=concurrency)
                done += n
                elapsed += seen.seconds
                for k, v in seen.outcomes.items():
                    totals[k] = totals.get(k, 0) + v
                readings.append(reading(done, elapsed, dict(totals)))
                print(json.dumps(readings[-1]), flush=True)
                if not a.alive():
                    break
            time.sleep(2.0)  # the last strangers' connections close
            readings.append(reading(done, elapsed, dict(totals)))
            with hostile_peer(read_private_key(b.dir / "node.key"), fleet,
                              s0["node"]["manifest_seq"], Target(a.id, addr)) as member:
                t0 = time.monotonic()
                reply = member.offer([])
                member_s = time.monotonic() - t0
        finally:
            a.stop()
    return {"strangers": strangers, "step": step, "concurrency": concurrency,
            "readings": readings, "member_session_s": round(member_s, 3),
            "member_session_ok": reply.error is None and reply.want is not None}


def render(r: dict[str, Any]) -> list[str]:
    rows = r["readings"]
    first, last = rows[0], rows[-1]
    warm = rows[1]
    lines = [
        f"Measured at `{r['commit']}` on {r['machine']}: `{r['command']}` "
        f"(readings in [`reliability/churn.json`](reliability/churn.json)).",
        "",
        f"{r['strangers']:,} strangers, {r['concurrency']} at a time, went through one daemon in "
        f"{last['seconds']:.0f} s; it was up after every step "
        f"({'yes' if all(x['alive'] for x in rows) else 'NO'}) and trained on "
        f"(round {first['round']} → {last['round']}). Outcomes seen by the strangers: "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(last["outcomes"].items())) + ". "
        f"A member's session over a fresh dial afterwards took {r['member_session_s']:.2f} s "
        f"({'completed' if r['member_session_ok'] else 'FAILED'}).",
        "",
        "| strangers | seconds | RSS MB | fds | round | peerstore | per-peer entries "
        "| forgotten | handler errors |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for x in rows:
        lib = x["libp2p"] or {}
        lines.append(f"| {x['strangers']:,} | {x['seconds']:.0f} | {x['rss_mb']:.1f} | {x['fds']} "
                     f"| {x['round']} | {lib.get('peerstore', '')} "
                     f"| {lib.get('per_peer_entries', '')} | {lib.get('forgotten', '')} "
                     f"| {lib.get('handler_errors', '')} |")
    growth = last["rss_mb"] - warm["rss_mb"]
    per_k = growth / max(1, (last["strangers"] - warm["strangers"])) * 1000
    lines += [
        "",
        f"RSS from the first step to the end: {growth:+.1f} MB "
        f"({per_k:+.2f} MB per 1,000 strangers); fds {warm['fds']} → {last['fds']}. The last "
        "row is read 2 s after the churn, once the last connections closed.",
    ]
    return lines


def write(r: dict[str, Any]) -> None:
    CHURN_JSON.parent.mkdir(parents=True, exist_ok=True)
    CHURN_JSON.write_text(json.dumps(r, indent=1) + "\n")
    text = RELIABILITY.read_text()
    block = f"<!-- bench:{MARK} -->\n" + "\n".join(render(r)) + f"\n<!-- /bench:{MARK} -->"
    pattern = re.compile(rf"<!-- bench:{MARK} -->.*?<!-- /bench:{MARK} -->", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + "\n\n## Stranger churn (issue 24)\n\n" + block + "\n"
    RELIABILITY.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strangers", type=int, default=5000)
    ap.add_argument("--step", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--write", action="store_true", help="store the readings, render the doc")
    args = ap.parse_args()
    started = _provenance.start(ap, args)
    r = run(args.strangers, args.step, args.concurrency)
    r.update(commit=commit(), machine=machine(),
             command="python -m benchmarks.bench_churn " + shlex.join(sys.argv[1:]),
             provenance=started.record())
    print("\n".join(render(r)))
    if args.write:
        write(r)


if __name__ == "__main__":
    main()
