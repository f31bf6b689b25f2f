"""What the namespace WAN's userspace delay line (tests/net/delaywire.py) costs: the most an
unshaped uplink carries through it, its CPU per byte, and the jitter it adds to a delay.

    sudo .venv/bin/python -m benchmarks.bench_delaywire [--mb 50] [--repeat 3]
        [--probes 200] [--delay-ms 40] [--no-write] [--render]

Each case builds a fresh WAN (tests/net/wan.py, one host per site, one public host) with an
unshaped uplink and sends ``--mb`` MB over one TCP connection from site a's host to the
public host (tests/net/wan_echo.py ``blast``: the seconds until the receiver's byte count
came back), ``--repeat`` times: on the plain veth uplink (no line), through the line with a
negligible delay (0.01 ms: the copy alone) and through it with ``--delay-ms``. For the line
it also reads the CPU seconds the lines' processes used over the transfer (/proc/PID/stat;
site a's carries the data one way and the ACKs back, site b's idles). Then ``--probes`` UDP
round trips, 10 ms apart, across the delayed line, unloaded: their spread is the jitter the
line adds (its loop wakes to each frame's due time; a round trip crosses it twice each way,
as both ends delay). Readings to docs/reproduction/slowlink/delaywire.json; the section of
docs/transport.md between the ``<!-- bench:delaywire -->`` markers is rendered from them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
READINGS = ROOT / "docs" / "reproduction" / "slowlink" / "delaywire.json"
TRANSPORT = ROOT / "docs" / "transport.md"
MARK = "delaywire"
ECHO = str(ROOT / "tests" / "net" / "wan_echo.py")
PORT = 7007
#: The copy alone: a delay this small is the line without a wait to speak of.
COPY_ONLY_MS = 0.01


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _case(delay_ms: float | None, mb: float, repeat: int, probes: int) -> dict[str, Any]:
    from tests.net.wan import Link, wan

    link = Link(delay_ms=delay_ms) if delay_ms is not None else None
    n = int(mb * 1e6)
    runs = []
    rtts: list[float] = []
    with wan((1, 1), 1, link=link) as w:
        src, dst = w.sites["a"].hosts[0], w.public[0]
        srv = subprocess.Popen(dst.python(ECHO, "serve", str(PORT)), stdout=subprocess.PIPE,
                               text=True)
        try:
            assert srv.stdout is not None
            assert srv.stdout.readline().strip() == "ready"
            for _ in range(repeat):
                cpu0 = [_cpu_s(p) for p in w.wire_pids]
                got = subprocess.run(src.python(ECHO, "blast", dst.address, str(PORT), str(n)),
                                     capture_output=True, text=True, timeout=120, check=True)
                s = float(got.stdout)
                cpu = sum(_cpu_s(p) for p in w.wire_pids) - sum(cpu0)
                runs.append({"bytes": n, "s": s, "mbit_s": round(n * 8 / s / 1e6, 1),
                             "wire_cpu_s": round(cpu, 3) if w.wire_pids else None})
            if probes and delay_ms is not None and delay_ms > COPY_ONLY_MS:
                rtts = _rtts(src.python(ECHO, "udp", "40000"), dst.address, probes)
        finally:
            srv.kill()
            srv.wait()
    return {"delay_ms": delay_ms, "runs": runs, "rtts_ms": rtts}


def _rtts(argv: list[str], dst: str, n: int) -> list[float]:
    flow = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert flow.stdin is not None
    assert flow.stdout is not None
    out = []
    try:
        for i in range(n + 1):  # the first warms the path (ARP crosses the line too)
            flow.stdin.write(f"{dst} {PORT}\n")
            flow.stdin.flush()
            answer = flow.stdout.readline().split()
            if i and answer and answer[0] != "timeout":
                out.append(float(answer[1]))
            time.sleep(0.01)
    finally:
        flow.kill()
        flow.wait()
    return out


def measure(mb: float, repeat: int, probes: int, delay_ms: float) -> dict[str, Any]:
    from tests.net.wan import Link, skip_reason

    reason = skip_reason(Link(delay_ms=delay_ms))
    if reason is not None:
        raise SystemExit(f"bench_delaywire: {reason}")
    cases = []
    for d in (None, COPY_ONLY_MS, delay_ms):
        cases.append(_case(d, mb, repeat, probes))
        print(f"delay {d}: {cases[-1]['runs']}", file=sys.stderr, flush=True)
    return {"mb": mb, "repeat": repeat, "probes": probes, "delay_ms": delay_ms,
            "cases": cases}


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def render(r: dict[str, Any]) -> str:
    lines = [
        f"One TCP connection, {r['mb']:g} MB from site a's host to the public host over an "
        f"unshaped uplink, median of {r['repeat']} runs; *line CPU*: the CPU seconds the "
        "uplinks' delay-line processes used over the transfer (its data one way, its ACKs "
        "the other), per GB sent.",
        "",
        "| uplink | throughput (Mbit/s) | line CPU (s per GB) |",
        "|---|---:|---:|",
    ]
    for c in r["cases"]:
        runs = c["runs"]
        name = ("veth pair (no delay line)" if c["delay_ms"] is None else
                f"delay line, {c['delay_ms']:g} ms each way")
        mbit = statistics.median(x["mbit_s"] for x in runs)
        cpu = ("–" if runs[0]["wire_cpu_s"] is None else
               f"{statistics.median(x['wire_cpu_s'] / x['bytes'] * 1e9 for x in runs):.1f}")
        lines.append(f"| {name} | {mbit:,.0f} | {cpu} |")
    delayed = r["cases"][-1]
    rtts = delayed["rtts_ms"]
    lines += ["", (f"Round trips across the {r['delay_ms']:g} ms line, unloaded: "
                   f"{len(rtts)} of {r['probes']} probes answered; min "
                   f"{min(rtts):.2f} ms, median {statistics.median(rtts):.2f} ms, 99th "
                   f"percentile {_pct(rtts, 0.99):.2f} ms, max {max(rtts):.2f} ms "
                   f"(2 × delay = {2 * r['delay_ms']:g} ms).")]
    if "provenance" in r:
        from benchmarks import _provenance

        lines += ["", _provenance.line(r["provenance"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    from benchmarks._report import run_section

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--delay-ms", type=float, default=40.0)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--render", action="store_true", help="re-render from the readings only")
    args = ap.parse_args()
    run_section(MARK, ap, args, READINGS,
                lambda: measure(args.mb, args.repeat, args.probes, args.delay_ms), render,
                TRANSPORT)


if __name__ == "__main__":
    main()
