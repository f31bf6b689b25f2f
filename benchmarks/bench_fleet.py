"""A fleet of real daemons on one machine: convergence, memory, CPU, mDNS and fanout at N.

    nice -n 10 .venv/bin/python -m benchmarks.bench_fleet --nodes 32 [--round-interval 10]
        [--steady-rounds 3] [--model mlp] [--timeout 900] [--out DIR] [--no-write]
    .venv/bin/python -m benchmarks.bench_fleet --report docs/reproduction/fleet/fleet-n32.json

Needs root and iproute2: ``N`` `peerd run` daemons (the default ``digits`` task, its 4,810-
parameter MLP unless ``--model``) start at once in N network namespaces on one private bridge
(:func:`peerd.mesh.localmesh.local_mesh`, as `peerd demo` does) and find each other by mDNS
alone; C = N − 1, τ_max = 6 rounds (at least 60 s), fanout and the other gossip bounds at their
defaults. Every 2 s it reads each daemon's ``/proc/PID/status`` and ``/proc/PID/stat`` and its
status over the control socket. It reports:

* **convergence**: seconds from launch until every node holds min(C, N − 1) entries younger
  than τ_max (and until every daemon answered, i.e. was listening); then it runs
  ``--steady-rounds`` more rounds on every node and checks the fleet is still converged;
* **memory**: each daemon's VmHWM (peak RSS since start) and its VmRSS at the end, against the
  daemon-memory goal of docs/benchmarks.md (torch baseline + (C + 3) × model size) and against
  a lone daemon with the same model measured in the same run (the daemon's own code, which that
  goal does not budget for, included);
* **CPU**: seconds of CPU (user + system) per daemon per round over the steady rounds, and per
  daemon from launch to convergence (imports and start-up included);
* **mDNS**: UDP port-5353 packets the hosts put on the bridge, per second, from an
  ``AF_PACKET`` counter in the switch namespace (:mod:`benchmarks._mdnscount`: each packet
  counted once, as it enters the bridge), from launch to convergence and in the steady rounds;
* **fanout**: each node's ``gossip`` counters (``peerd status --json``): the most sessions it
  started in one sweep (must not exceed the fanout), the most of its own running at once, the
  sessions it started per round, inbound sessions refused busy.

Outputs: ``--out``/fleet-n<N>.json (every sample's summary and the per-node figures) and, unless
``--no-write``, the ``fleet`` section of docs/benchmarks.md; ``--report`` renders that section
again from a saved JSON (the text changed, the measurements did not). Daemons, the counter and the
namespaces are always removed, also on errors.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from benchmarks import _provenance
from benchmarks._daemons import REPO, vm_of
from benchmarks.bench_daemon import torch_baseline
from peerd.control.status import Status
from peerd.learn.models import default_model_kind
from peerd.mesh import netns
from peerd.mesh.localmesh import MeshNode, local_mesh
from peerd.node.peers import DEFAULT_FANOUT

DEFAULT_OUT = REPO / "docs" / "reproduction" / "fleet"
SAMPLE_S = 2.0
#: τ_max in rounds (at least MIN_TAU_S), as `peerd demo --round-interval` sets it.
TAU_ROUNDS = 6
MIN_TAU_S = 60.0
#: Rounds a lone daemon runs before its memory is read.
LONE_ROUNDS = 3
CLK_TCK = os.sysconf("SC_CLK_TCK")
MB = 1e6


@dataclass
class Sample:
    """One reading of every node: seconds since launch, and per node (None until it answers)."""

    t: float
    statuses: list[Status | None]
    vm: list[dict[str, int]]
    cpu_s: list[float]
    mdns: dict[str, float] = field(default_factory=dict)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def pss_of(pid: int) -> dict[str, int]:
    """Pss / Pss_Anon / Pss_File (bytes) from /proc/PID/smaps_rollup: resident memory with each
    page shared by k processes counted 1/k, so the fleet's sum is what it really occupies
    (RSS counts torch's shared libraries in full in every daemon)."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Pss", "Pss_Anon", "Pss_File"):
            out[key] = int(value.split()[0]) * 1024
    return out


def fresh(s: Status, tau: float) -> int:
    return sum(1 for c in s.cache if c.age_s < tau)


def converged(statuses: list[Status | None], want: int, tau: float) -> bool:
    return all(s is not None and fresh(s, tau) >= want for s in statuses)


def read(mesh: list[MeshNode], t0: float, counter_log: Path | None) -> Sample:
    statuses = [n.poll(timeout=5.0) for n in mesh]
    vm, cpu = [], []
    for n in mesh:
        if not n.alive():
            raise RuntimeError(f"node{n.index} exited ({n.exit_code()}):\n" + "\n".join(n.tail()))
        assert n.proc is not None
        # `ip netns exec` execs the daemon: the pid is the daemon's own.
        vm.append(vm_of(Path(f"/proc/{n.proc.pid}/status").read_text()))
        cpu.append(cpu_seconds(n.proc.pid))
    return Sample(time.monotonic() - t0, statuses, vm, cpu, last_count(counter_log))


def last_count(log: Path | None) -> dict[str, float]:
    if log is None or not log.exists():
        return {}
    lines = log.read_text().splitlines()
    return json.loads(lines[-1]) if lines else {}


def switch_of(host: netns.Host) -> str:
    # netns.lan names the hosts "<prefix>-<tag>-h<i>" and the switch "<prefix>-<tag>-sw".
    return host.name.rsplit("-h", 1)[0] + "-sw"


def mdns_rate(a: dict[str, float], b: dict[str, float], key: str) -> float:
    if not a or not b or b["t"] <= a["t"]:
        return float("nan")
    return (b[key] - a[key]) / (b["t"] - a["t"])


def run_lone(model: str | None, interval: float, deadline_s: float) -> dict[str, Any]:
    """One daemon, same model and settings, alone in one namespace: its memory after a few
    rounds (the daemon's fixed cost at this model size)."""
    with tempfile.TemporaryDirectory(prefix="peerd-fleet-") as tmp, local_mesh(
            Path(tmp), 1, use_netns=True, models=None if model is None else (model,),
            learning={"round_interval_s": min(interval, 2.0)}) as mesh:
        t0 = time.monotonic()
        while time.monotonic() - t0 < deadline_s:
            s = read(mesh, t0, None)
            status = s.statuses[0]
            if status is not None and status.node.round >= LONE_ROUNDS:
                return {"vm": s.vm[0], "rounds": status.node.round, "cpu_s": s.cpu_s[0]}
            time.sleep(0.5)  # polling a daemon: nothing to wait on from outside it
    raise RuntimeError(f"a lone daemon did not do {LONE_ROUNDS} rounds in {deadline_s:.0f} s")


def run_fleet(n: int, model: str | None, interval: float, steady_rounds: int,
              timeout_s: float) -> dict[str, Any]:
    tau = max(MIN_TAU_S, TAU_ROUNDS * interval)
    want = n - 1  # C = n − 1 (local_mesh's capacity): min(C, N − 1)
    learning: dict[str, object] = {"round_interval_s": interval, "tau_max": tau}
    samples: list[Sample] = []
    with tempfile.TemporaryDirectory(prefix="peerd-fleet-") as tmp, local_mesh(
            Path(tmp), n, use_netns=True, models=None if model is None else (model,),
            learning=learning) as mesh:
        t0 = time.monotonic()
        counter_log = Path(tmp) / "mdns.jsonl"
        assert mesh[0].host is not None
        with counter_log.open("w") as out:
            switch = netns.Host(switch_of(mesh[0].host), "")
            counter = subprocess.Popen(
                switch.python("-m", "benchmarks._mdnscount", "br0"),
                stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            answered_at = converged_at = None
            steady_from: Sample | None = None
            while True:
                s = read(mesh, t0, counter_log)
                samples.append(s)
                if answered_at is None and all(st is not None for st in s.statuses):
                    answered_at = s.t
                if converged_at is None and converged(s.statuses, want, tau):
                    converged_at, steady_from = s.t, s
                if steady_from is not None and all(
                        st is not None and b is not None
                        and st.node.round >= b.node.round + steady_rounds
                        for st, b in zip(s.statuses, steady_from.statuses, strict=True)):
                    break
                if s.t > timeout_s:
                    tails = "\n".join(f"--- node{m.index}\n" + "\n".join(m.tail(8))
                                      for m in mesh[:4])
                    raise RuntimeError(f"no convergence and {steady_rounds} steady rounds in "
                                       f"{timeout_s:.0f} s (converged at {converged_at})\n"
                                       f"{tails}")
                time.sleep(max(0.0, SAMPLE_S - (time.monotonic() - t0 - s.t)))
            pss = [pss_of(m.proc.pid) for m in mesh if m.proc is not None]
        finally:
            counter.terminate()
            counter.wait(10)
        end = samples[-1]
        end.mdns = last_count(counter_log)  # the counter's last line, written on SIGTERM
    assert converged_at is not None
    assert steady_from is not None
    return summarise(n, model, interval, tau, want, samples, answered_at, converged_at,
                     steady_from, end) | {
        "pss_end_median": statistics.median(x["Pss"] for x in pss),
        "pss_end_sum": sum(x["Pss"] for x in pss),
        "pss_anon_end_median": statistics.median(x["Pss_Anon"] for x in pss),
        "pss_end": pss}


def summarise(n: int, model: str | None, interval: float, tau: float, want: int,
              samples: list[Sample], answered_at: float | None, converged_at: float,
              a: Sample, b: Sample) -> dict[str, Any]:
    sa = [s for s in a.statuses if s is not None]
    sb = [s for s in b.statuses if s is not None]
    rounds = [y.node.round - x.node.round for x, y in zip(sa, sb, strict=True)]
    cpu_round = [(cb - ca) / r for ca, cb, r in zip(a.cpu_s, b.cpu_s, rounds, strict=True)]
    dials_round = [(y.gossip.get("dials", 0) - x.gossip.get("dials", 0)) / r
                   for x, y, r in zip(sa, sb, rounds, strict=True)]
    first = next((s.mdns for s in samples if s.mdns), {})
    hwm = [v["VmHWM"] for v in b.vm]
    rss = [v["VmRSS"] for v in b.vm]
    per_node = [{"node": i, "round": s.node.round, "fresh_entries": fresh(s, tau),
                 "VmHWM": v["VmHWM"], "VmRSS": v["VmRSS"], "RssAnon": v.get("RssAnon"),
                 "cpu_s_total": c, "cpu_s_per_round": cr, "gossip": dict(s.gossip)}
                for i, (s, v, c, cr) in enumerate(zip(sb, b.vm, b.cpu_s, cpu_round,
                                                      strict=True))]
    return {
        "nodes": n, "model": model or default_model_kind("digits"), "round_interval_s": interval,
        "tau_max_s": tau, "capacity": n - 1, "want_fresh": want, "fanout": DEFAULT_FANOUT,
        "all_answered_s": answered_at, "converged_s": converged_at,
        "widest_sample_gap_s": max(y.t - x.t for x, y in itertools.pairwise(samples)),
        "steady_s": b.t - a.t, "steady_rounds_min": min(rounds),
        "still_converged_at_end": converged(b.statuses, want, tau),
        "fresh_at_end_min": min(fresh(s, tau) for s in sb),
        "vm_hwm_max": max(hwm), "vm_hwm_median": statistics.median(hwm),
        "vm_rss_end_max": max(rss), "vm_rss_end_median": statistics.median(rss),
        "cpu_s_per_round_median": statistics.median(cpu_round),
        "cpu_s_per_round_max": max(cpu_round),
        "cpu_s_to_converged_median": statistics.median(a.cpu_s),
        "dials_per_round_median": statistics.median(dials_round),
        "most_dials_in_a_sweep": max(s.gossip.get("most_dials_in_a_sweep", 0) for s in sb),
        "most_outbound_at_once": max(s.gossip.get("most_outbound_at_once", 0) for s in sb),
        "busy_refusals": sum(s.gossip.get("busy_refusals", 0) for s in sb),
        "duplicates_avoided": sum(s.gossip.get("duplicates_avoided", 0) for s in sb),
        "mdns_startup_pps": mdns_rate(first, a.mdns, "ipv4") + mdns_rate(first, a.mdns, "ipv6"),
        "mdns_steady_pps": mdns_rate(a.mdns, b.mdns, "ipv4") + mdns_rate(a.mdns, b.mdns, "ipv6"),
        "mdns_steady_bytes_per_s": (mdns_rate(a.mdns, b.mdns, "ipv4_bytes")
                                    + mdns_rate(a.mdns, b.mdns, "ipv6_bytes")),
        "mdns_counts_end": b.mdns, "other_steady_fps": mdns_rate(a.mdns, b.mdns, "other"),
        "per_node": per_node,
        "timeline": [{"t": s.t, "answered": sum(x is not None for x in s.statuses),
                      "converged_nodes": sum(x is not None and fresh(x, tau) >= want
                                             for x in s.statuses),
                      "min_fresh": min((fresh(x, tau) for x in s.statuses if x is not None),
                                       default=0),
                      "mdns_packets": s.mdns.get("ipv4", 0) + s.mdns.get("ipv6", 0)}
                     for s in samples],
    }


def report(r: dict[str, Any], lone: dict[str, Any] | None, baseline: int, model_bytes: int,
           command: str, machine: str, load: tuple[list[float], list[float]]) -> str:
    n, c = r["nodes"], r["capacity"]
    goal = baseline + (c + 3) * model_bytes
    end = r["mdns_counts_end"]
    mdns_total = end.get("ipv4", 0) + end.get("ipv6", 0)
    lines = [
        f"## Fleet: {n} daemons on one machine (namespaces, mDNS)", "",
        f"Machine: {machine}. Command: `{command}` (as root; load average "
        f"{', '.join(f'{x:.1f}' for x in load[0])} before, "
        f"{', '.join(f'{x:.1f}' for x in load[1])} after, the fleet's own start-up included). "
        f"Outputs: `docs/reproduction/fleet/fleet-n{n}.json`.", "",
        f"{n} `peerd run` daemons started at once, each in its own network namespace on one "
        f"bridge, found each other by mDNS alone (task `digits`, model "
        f"{r['model']} of {model_bytes / 1e3:.1f} kB, round interval "
        f"{r['round_interval_s']:g} s, τ_max {r['tau_max_s']:g} s, C = {c}, fanout "
        f"{r['fanout']}, other gossip bounds at their defaults). Every 2 s the benchmark read "
        "each daemon's `/proc/PID/status`, `/proc/PID/stat` and status (control socket); "
        "`Pss` comes from `/proc/PID/smaps_rollup` at the end. mDNS packets are counted by an "
        "`AF_PACKET` socket in the bridge's namespace (`benchmarks/_mdnscount.py`): UDP to or "
        "from port 5353, each packet once as it enters the bridge from a host (not once per "
        "port it is flooded to), IPv4 and IPv6 together; the counter starts a fraction of a "
        "second after the daemons, before any of them has imported its modules. zeroconf "
        f"{version('zeroconf')} sends a browser's first 4 queries at start-up and then "
        "re-queries a pointer record at 75 % of its 4,500 s TTL, so after the start-up burst "
        "the bridge stays quiet for about 56 minutes: the steady figure covers only the "
        "rounds measured here, not the hourly refresh.", "",
        "| reading | value |", "| --- | --- |",
        f"| every daemon answering its control socket | {r['all_answered_s']:.0f} s after "
        f"launch |",
        f"| converged: every node holds min(C, N − 1) = {r['want_fresh']} entries younger "
        f"than τ_max | {r['converged_s']:.0f} s after launch (read every 2 s; the widest gap "
        f"between readings, while the daemons started, was {r['widest_sample_gap_s']:.0f} s) |",
        f"| still converged after {r['steady_rounds_min']}+ more rounds on every node "
        f"({r['steady_s']:.0f} s) | {'yes' if r['still_converged_at_end'] else 'no'} "
        f"(fewest fresh entries on a node: {r['fresh_at_end_min']}) |",
        f"| peak RSS (VmHWM) per daemon: highest / median | {r['vm_hwm_max'] / MB:.0f} / "
        f"{r['vm_hwm_median'] / MB:.0f} MB |",
        f"| steady RSS (VmRSS at the end) per daemon: highest / median | "
        f"{r['vm_rss_end_max'] / MB:.0f} / {r['vm_rss_end_median'] / MB:.0f} MB |",
        f"| proportional set size (Pss, shared pages split between the daemons) per daemon "
        f"at the end, median (of which anonymous); all {n} together | "
        f"{r['pss_end_median'] / MB:.0f} ({r['pss_anon_end_median'] / MB:.0f}) MB; "
        f"{r['pss_end_sum'] / MB:.0f} MB |",
        f"| daemon-memory goal: torch baseline {baseline / MB:.0f} MB + (C + 3) × model | "
        f"{goal / MB:.0f} MB |",
    ]
    if lone is not None:
        lone_goal = lone["vm"]["VmHWM"] + (c + 3) * model_bytes
        lines.append(f"| a lone daemon, same model, {lone['rounds']} rounds: VmHWM; + (C + 3) "
                     f"× model | {lone['vm']['VmHWM'] / MB:.0f} MB; {lone_goal / MB:.0f} MB |")
    lines += [
        f"| CPU per daemon per round in the steady rounds: median / highest (all {n} "
        f"together, in cores) | {r['cpu_s_per_round_median']:.2f} / "
        f"{r['cpu_s_per_round_max']:.2f} s "
        f"({n * r['cpu_s_per_round_median'] / r['round_interval_s']:.1f}) |",
        f"| CPU per daemon from launch to convergence (imports included), median | "
        f"{r['cpu_s_to_converged_median']:.1f} s |",
        f"| mDNS packets/s on the bridge (all {n} hosts): launch → converged / steady | "
        f"{r['mdns_startup_pps']:.1f} / {r['mdns_steady_pps']:.2f} |",
        f"| mDNS bytes/s in the steady rounds (Ethernet frames) | "
        f"{r['mdns_steady_bytes_per_s']:.0f} |",
        f"| mDNS packets in all, launch → end: packets (per daemon), kB | "
        f"{mdns_total} ({mdns_total / n:.0f}), "
        f"{(end.get('ipv4_bytes', 0) + end.get('ipv6_bytes', 0)) / 1e3:.0f} |",
        f"| most sessions one node started in one sweep (fanout {r['fanout']}) | "
        f"{r['most_dials_in_a_sweep']} |",
        f"| most of one node's own sessions running at once | {r['most_outbound_at_once']} |",
        f"| sessions a node started per round, median | {r['dials_per_round_median']:.1f} |",
        f"| inbound sessions refused busy, all nodes | {r['busy_refusals']} |",
        f"| entries not fetched twice at once (InFlight), all nodes | "
        f"{r['duplicates_avoided']} |",
    ]
    meets = "meets" if r["vm_hwm_max"] <= goal else "exceeds"
    verdict = (f"Verdict: converged in {r['converged_s']:.0f} s. The highest peak RSS, "
               f"{r['vm_hwm_max'] / MB:.0f} MB, {meets} the daemon-memory goal of "
               f"{goal / MB:.0f} MB (torch baseline + (C + 3) × model)")
    if lone is not None:
        extra = r["vm_hwm_max"] - lone["vm"]["VmHWM"]
        verdict += (f", which leaves out the daemon's own code: a lone daemon with the same "
                    f"model peaks at {lone['vm']['VmHWM'] / MB:.0f} MB "
                    f"({(lone['vm']['VmHWM'] - baseline) / MB:.0f} MB over the torch "
                    f"baseline), and a daemon of this fleet {extra / MB:+.0f} MB beside it "
                    f"((C + 3) × model is {(c + 3) * model_bytes / MB:.1f} MB)")
    verdict += (f". No node started more than {r['most_dials_in_a_sweep']} sessions in a sweep "
                f"(fanout {r['fanout']}).")
    if r["most_outbound_at_once"] > r["fanout"]:
        verdict += (f" The fanout bounds what one sweep starts, not how many sweeps run or how "
                    f"long their sessions last: every mDNS discovery and every publish wakes "
                    f"the gossip loop at once, so while {n} daemons started on 2 cores a node "
                    f"had up to {r['most_outbound_at_once']} of its own sessions running "
                    f"together, and it started {r['dials_per_round_median']:.1f} per "
                    f"{r['round_interval_s']:g} s round.")
    lines += ["", verdict]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--round-interval", type=float, default=10.0)
    p.add_argument("--steady-rounds", type=int, default=3)
    p.add_argument("--model", default=None, help="[task] model; default the task's own")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--skip-lone", action="store_true")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--report", type=Path, metavar="JSON",
                   help="no daemons: render the section again from a run's saved JSON")
    args = p.parse_args()
    if args.report is not None:
        render(json.loads(args.report.read_text()), not args.no_write)
        return
    why = netns.unavailable()
    if why is not None:
        print(f"bench_fleet: {why}", file=sys.stderr)
        sys.exit(2)
    started = _provenance.start(p, args)
    from benchmarks._report import machine
    from peerd.learn.models import build_model, count_parameters, default_model_kind

    load_before = list(os.getloadavg())
    # digits: 8×8 images, 10 classes (what the daemons' task builds).
    params = count_parameters(build_model(args.model or default_model_kind("digits"), (64,),
                                          10, seed=0))
    model_bytes = 4 * params
    baseline = torch_baseline()
    lone = None if args.skip_lone else run_lone(args.model, args.round_interval, 180.0)
    r = run_fleet(args.nodes, args.model, args.round_interval, args.steady_rounds,
                  args.timeout)
    load_after = list(os.getloadavg())
    command = ".venv/bin/python -m benchmarks.bench_fleet " + " ".join(sys.argv[1:])
    r |= {"torch_baseline": baseline, "model_params": params, "model_bytes": model_bytes,
          "lone": lone, "load_before": load_before, "load_after": load_after,
          "command": command, "machine": machine(), "provenance": started.record()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"fleet-n{args.nodes}.json").write_text(json.dumps(r, indent=1) + "\n")
    render(r, not args.no_write)


def render(r: dict[str, Any], write: bool) -> None:
    from benchmarks._report import write_section

    # Runs saved before the gap was recorded: the same figure from their timeline.
    r.setdefault("widest_sample_gap_s", max(
        y["t"] - x["t"] for x, y in itertools.pairwise(r["timeline"])))
    text = report(r, r["lone"], r["torch_baseline"], r["model_bytes"], r["command"],
                  r["machine"], (r["load_before"], r["load_after"]))
    print(text)
    if write:
        write_section("fleet", text)


if __name__ == "__main__":
    main()
