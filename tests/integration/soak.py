"""The soak and fault suite (issue 12): real daemons in network namespaces, faults on a
schedule, invariants checked after each fault and at the end.

One LAN bridge ("lan") holds ``daemons`` hosts, each running `peerd run` with mDNS on, plus an
outsider host running tests/integration/soak_agent.py (strangers, a member's key sending
garbage, fake mDNS instances). A second bridge ("island") takes half the hosts during a
partition. Faults, in a seeded order, churn (SIGKILL and restart of one node) between every
two others:

churn, partition (heals), address_change (DHCP-style: a new address, the old one deleted),
clock_step (±10 min on one node's daemon clock: tests/integration/stepped_clock.py),
stranger_probe, stranger_flood (held connections), mdns_wave, garbage_member.

After each fault the mesh must re-converge: every running node holds every other running
node's first entry made after the fault ended (the time it took is recorded; the issue's
budget is two round intervals). At the end every daemon stops cleanly and its state
directory is verified the way a daemon start verifies it. tests/integration/soak_metrics.py
checks the per-sample invariants and RSS/fd. Run: ``python -m benchmarks.soak --minutes 30``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from peerd.net.addrs import ADDRESS_POLL_S
from peerd.store.keyfile import NODE_KEY_FILE, read_private_key
from tests.integration.mesh import PEERD, STARTUP_TIMEOUT_S, Node, audit, make_fleet
from tests.integration.soak_metrics import Sampler
from tests.integration.topology import Topology, topology

REPO = Path(__file__).resolve().parents[2]
SUBNET = "10.79.0"
KINDS = ("partition", "address_change", "clock_step", "stranger_probe", "stranger_flood",
         "mdns_wave", "garbage_member")


@dataclass(frozen=True)
class SoakConfig:
    minutes: float = 30.0
    daemons: int = 4
    round_interval_s: float = 5.0
    flood: int = 300
    flood_hold_s: float = 60.0
    wave: int = 1500
    partition_s: float = 30.0
    clock_hold_s: float = 30.0
    #: Churn between every two other faults (False: once only, for the short CI run).
    churn_between: bool = True
    #: The fault kinds to inject (a subset of KINDS, for a targeted run), and whether churn
    #: comes among them at all.
    kinds: tuple[str, ...] = KINDS
    churn: bool = True
    #: Record each node's TCP connections (``ss -tnoi``) right after a partition heals or an
    #: address changes: which connections survived the fault, and their retransmission state.
    diagnose: bool = False
    #: A fault after which the mesh has not re-converged by then fails the run.
    converge_timeout_s: float = 120.0
    seed: int = 12


@dataclass
class SoakNode(Node):
    #: Set for the node whose clock the soak steps: it runs under stepped_clock.py.
    offset_file: Path | None = None

    def start(self) -> None:
        if self.offset_file is None:
            super().start()
            return
        argv = [sys.executable, "-m", "tests.integration.stepped_clock", "--config",
                str(self.config), "--offset-file", str(self.offset_file)]
        if self.host is not None:
            argv = self.host.command(argv)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})


class Agent:
    """The outsider process in its namespace: one JSON command, one JSON answer."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd=REPO, text=True, bufsize=1,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.read(STARTUP_TIMEOUT_S)

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise AssertionError(f"soak agent silent or gone (rc {self.proc.poll()})")
        result: dict[str, Any] = json.loads(line)
        if "error" in result:
            raise AssertionError(f"soak agent: {result}")
        return result

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@dataclass
class Fault:
    kind: str
    t: float
    detail: dict[str, Any] = field(default_factory=dict)
    converge_s: float | None = None  # None: not re-converged within the timeout


class Soak:
    def __init__(self, cfg: SoakConfig, root: Path, net: Topology) -> None:
        self.cfg, self.root, self.net = cfg, root, net
        self.rng = random.Random(cfg.seed)
        net.bridge("lan")
        net.bridge("island")
        hosts = [net.host(f"n{i}", ("lan", f"{SUBNET}.{i + 1}/24")) for i in range(cfg.daemons)]
        self.outsider = net.host("x", ("lan", f"{SUBNET}.250/24"))
        n = cfg.daemons + 1  # the last member never runs a daemon: its key sends garbage
        plain = make_fleet(root, n, hosts=[*hosts, self.outsider], mdns=True, base_port=4011,
                           learning={"round_interval_s": cfg.round_interval_s,
                                     "tau_max": 120.0, "local_steps": 3,
                                     "capacity": cfg.daemons})
        self.nodes = [SoakNode(**{k: getattr(p, k) for k in ("name", "dir", "id", "port",
                                                              "host")}) for p in plain]
        self.garbage = self.nodes.pop()
        self.clock_node = self.nodes[-1]
        self.clock_node.offset_file = root / "clock-offset"
        self.set_offset(0)
        self.addr = {node.name: node.address for node in self.nodes}
        fleet = json.loads((root / "fleet" / "fleet.json").read_text())
        self.fleet_hex: str = fleet["fleet_id"]
        self.sampler = Sampler(list(self.nodes), {node.id for node in plain})
        self.faults: list[Fault] = []
        self.agent_results: list[dict[str, Any]] = []
        self.restart_s: list[float] = []
        self.start_refused = 0
        self.moves = 0
        self.clock_sign = 1

    # ------------------------------------------------------------------ helpers
    def set_offset(self, seconds: float) -> None:
        assert self.clock_node.offset_file is not None
        tmp = self.clock_node.offset_file.with_suffix(".tmp")
        tmp.write_text(f"{seconds}\n")
        tmp.replace(self.clock_node.offset_file)

    def live(self) -> list[SoakNode]:
        return [node for node in self.nodes if node.alive()]

    def statuses(self) -> dict[str, dict[str, Any]]:
        out = {}
        for node in self.live():
            s = node.status(timeout=5.0)
            if s is not None:
                out[node.name] = s
        return out

    def wait_up(self, node: SoakNode) -> float:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        t0 = time.monotonic()
        while time.monotonic() < deadline:
            if not node.alive():
                raise AssertionError(f"{node.name} exited:\n{node.logs()[-3000:]}")
            s = node.status(timeout=5.0)
            if s is not None and s["node"]["published_version"] is not None:
                return time.monotonic() - t0
            time.sleep(0.5)
        raise AssertionError(f"{node.name} did not come up:\n{node.logs()[-3000:]}")

    def targets(self) -> dict[str, int]:
        """Each running node's next entry: the first made after now."""
        out = {}
        for node in self.live():
            s = node.status(timeout=5.0)
            assert s is not None, node.logs()[-2000:]
            out[node.id] = (s["node"]["published_version"] or 0) + 1
        return out

    def converge(self, t_end: float) -> float | None:
        """Seconds from ``t_end`` until every running node caches every other running
        node's first entry made after ``t_end``; None after the timeout."""
        want = self.targets()
        while time.monotonic() - t_end < self.cfg.converge_timeout_s:
            polled = time.monotonic()
            ss = self.statuses()
            if len(ss) == len(self.live()) and all(
                    all(any(c["origin"] == o and c["version"] >= v for c in s["cache"])
                        for o, v in want.items() if o != s["node"]["id"]) for s in ss.values()):
                return polled - t_end
            time.sleep(0.25)
        return None

    def record(self, kind: str, t_end: float, **detail: Any) -> Fault:
        # t: when the fault ended (seconds into the soak), where convergence is timed from.
        fault = Fault(kind, round(t_end - self.sampler.t0, 1), detail)
        fault.converge_s = self.converge(t_end)
        if fault.converge_s is not None:
            fault.converge_s = round(fault.converge_s, 2)
        self.faults.append(fault)
        print(f"[{fault.t:7.1f}s] {kind}: re-converged in {fault.converge_s} s {detail}",
              flush=True)
        return fault

    def target(self, node: SoakNode) -> dict[str, Any]:
        return {"target": node.id, "addr": f"/ip4/{self.addr[node.name]}/tcp/{node.port}"}

    def connections(self) -> dict[str, list[str]]:
        """Each node's TCP connections to the daemons' ports, with their retransmission
        state, when ``cfg.diagnose`` is set: "STATE LOCAL PEER" and, from ``ss -tnoi``, the
        timer (kind, time to expiry, retransmissions so far), rto (ms), backoff and unacked
        segments where present."""
        if not self.cfg.diagnose:
            return {}
        out = {}
        for node in self.nodes:
            assert node.host is not None
            done = subprocess.run(node.host.command(["ss", "-tnoiH"]), capture_output=True,
                                  text=True, timeout=10, check=False)
            lines = done.stdout.splitlines()
            # ss prints each connection on one line and its details on the next.
            rows = []
            for head, info in zip(lines[::2], lines[1::2], strict=False):
                cols = head.split()
                if len(cols) < 5 or ":40" not in cols[3] + cols[4]:
                    continue
                keep = [w for w in (head + " " + info).split()
                        if w.startswith(("timer:", "rto:", "backoff:", "unacked:"))]
                rows.append(" ".join([cols[0], cols[3], cols[4], *keep]))
            out[node.name] = rows
        return out

    def seq(self) -> int:
        s = self.nodes[0].status()
        assert s is not None
        return int(s["node"]["manifest_seq"])

    # ------------------------------------------------------------------ faults
    def churn(self) -> None:
        victim = self.rng.choice(self.nodes[1:])  # node0 stays up: its RSS/fd span the run
        with self.sampler.lock:
            self.sampler.absorb(victim)
            assert victim.proc is not None
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(30)
            victim.proc = None
            victim.start()
        up = self.wait_up(victim)
        self.restart_s.append(up)
        start = [e for e in audit(victim) if e["event"] == "start"][-1]
        self.start_refused += start["refused"]
        self.record("churn", time.monotonic(), node=victim.name, restart_s=round(up, 1),
                    restored=start["cached"], refused_on_restore=start["refused"])

    def partition(self) -> None:
        island = self.nodes[len(self.nodes) // 2:]
        for node in island:
            assert node.host is not None
            self.net.move(node.host, "eth0", "island")
        time.sleep(self.cfg.partition_s)  # the partition's length, not a wait for an event
        before_heal = self.connections()
        for node in island:
            assert node.host is not None
            self.net.move(node.host, "eth0", "lan")
        fault = self.record("partition", time.monotonic(), island=[n.name for n in island],
                            held_s=self.cfg.partition_s)
        if self.cfg.diagnose:
            fault.detail.update(conns_before_heal=before_heal,
                                conns_after=self.connections())

    def address_change(self) -> None:
        node = self.rng.choice(self.nodes[1:])
        assert node.host is not None
        self.moves += 1
        old, new = self.addr[node.name], f"{SUBNET}.{100 + self.moves}"
        subprocess.run(node.host.command(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/conf/eth0/"
                                          "promote_secondaries"]), check=True, timeout=10)
        for args in (("add", f"{new}/24"), ("del", f"{old}/24")):
            subprocess.run(["ip", "-n", node.host.name, "addr", *args, "dev", "eth0"],
                           check=True, timeout=10)
        self.addr[node.name] = new
        at_change = self.connections()
        fault = self.record("address_change", time.monotonic(), node=node.name, old=old,
                            new=new, poll_s=ADDRESS_POLL_S)
        if self.cfg.diagnose:
            fault.detail.update(conns_at_change=at_change, conns_after=self.connections())

    def clock_step(self) -> None:
        step = 600 * self.clock_sign
        self.clock_sign = -self.clock_sign
        self.set_offset(step)
        time.sleep(self.cfg.clock_hold_s)  # how long the clock stays wrong
        self.set_offset(0)
        self.record("clock_step", time.monotonic(), node=self.clock_node.name, step_s=step,
                    held_s=self.cfg.clock_hold_s)

    def stranger_probe(self, agent: Agent) -> None:
        node = self.rng.choice(self.live())
        agent.send(cmd="probe", seq=self.seq(), **self.target(node))
        result = agent.read(120)
        self.agent_results.append(result)
        self.record("stranger_probe", time.monotonic(), node=node.name,
                    sessions=result["sessions"])

    def stranger_flood(self, agent: Agent) -> None:
        node = self.nodes[0]
        agent.send(cmd="flood", count=self.cfg.flood, hold_s=self.cfg.flood_hold_s,
                   **self.target(node))
        # While the strangers hold their connections, the members must keep converging.
        time.sleep(min(10.0, self.cfg.flood_hold_s / 2))  # strangers dialling in
        held = self.record("stranger_flood_held", time.monotonic(), node=node.name)
        result = agent.read(self.cfg.flood_hold_s + 180)
        self.agent_results.append(result)
        held.detail.update(connected=result["connected"],
                           closed_by_target=result["closed_by_target"])
        self.record("stranger_flood", time.monotonic(), node=node.name,
                    count=self.cfg.flood, held_s=self.cfg.flood_hold_s,
                    connected=result["connected"], closed_by_target=result["closed_by_target"])

    def mdns_wave(self, agent: Agent) -> None:
        agent.send(cmd="mdns_wave", count=self.cfg.wave, fleet=self.fleet_hex,
                   iface_ip=self.outsider.address, seed=self.rng.randrange(2**32), hold_s=5.0)
        result = agent.read(300)
        self.agent_results.append(result)
        self.record("mdns_wave", time.monotonic(), instances=result["instances"],
                    packets=result["packets"])

    def garbage_member(self, agent: Agent) -> None:
        node = self.rng.choice(self.live())
        key = read_private_key(self.garbage.dir / NODE_KEY_FILE)
        agent.send(cmd="garbage", key=key.private_bytes_raw().hex(), seq=self.seq(),
                   version=1 + 10 * len(self.faults), **self.target(node))
        result = agent.read(300)
        self.agent_results.append(result)
        self.record("garbage_member", time.monotonic(), node=node.name,
                    sessions={k: v for k, v in result.items() if k not in ("cmd", "wall_s")})

    # ------------------------------------------------------------------ run
    def schedule(self) -> Iterator[str]:
        while True:
            kinds = list(self.cfg.kinds)
            self.rng.shuffle(kinds)
            for i, kind in enumerate(kinds):
                if self.cfg.churn and (self.cfg.churn_between or (i == min(2, len(kinds) - 1)
                                       and not any(f.kind == "churn" for f in self.faults))):
                    yield "churn"
                yield kind

    def run(self) -> dict[str, Any]:
        started = time.time()
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            self.wait_up(node)
        first = self.converge(time.monotonic())
        assert first is not None, "the mesh never converged at start-up"
        self.sampler.t0 = time.monotonic()
        self.sampler.start()
        agent = Agent(self.outsider.python("-m", "tests.integration.soak_agent", "--fleet-id",
                                           self.fleet_hex))
        done: set[str] = set()
        try:
            for kind in self.schedule():
                over = self.sampler.now() >= self.cfg.minutes * 60
                if over and done >= {*self.cfg.kinds, *(["churn"] if self.cfg.churn else [])}:
                    break
                fn: Callable[..., None] = getattr(self, kind)
                fn(agent) if kind in ("stranger_probe", "stranger_flood", "mdns_wave",
                                      "garbage_member") else fn()
                done.add(kind)
        finally:
            agent.close()
            self.sampler.stop()
        self.sampler.sample_once()
        self.sampler.absorb_all()
        duration = self.sampler.now()
        exit_codes = {}
        for node in self.nodes:
            exit_codes[node.name] = node.stop()
        states = {node.name: verify_state(node) for node in self.nodes}
        return self.figures(started, duration, exit_codes, states)

    def figures(self, started: float, duration: float, exit_codes: dict[str, int | None],
                states: dict[str, dict[str, Any]]) -> dict[str, Any]:
        s = self.sampler
        by_kind: dict[str, list[float | None]] = {}
        for f in self.faults:
            by_kind.setdefault(f.kind, []).append(f.converge_s)
        budget = 2 * self.cfg.round_interval_s
        convergence = {k: {
            "count": len(v), "not_converged": sum(x is None for x in v),
            "median_s": round(statistics.median([x for x in v if x is not None]), 2)
            if any(x is not None for x in v) else None,
            "max_s": max((x for x in v if x is not None), default=None),
            "within_budget": sum(x is not None and x <= budget for x in v)}
            for k, v in by_kind.items()}
        audit_refused: Counter[str] = Counter()
        for node in self.nodes:
            for e in audit(node):
                if e["event"] == "refused":
                    audit_refused[e["reason"]] += e.get("count", 1)
        corrupt = sum(not st["ok"] for st in states.values()) + self.start_refused
        return {
            "config": asdict(self.cfg), "started": started, "duration_s": round(duration, 1),
            "daemons": len(self.nodes), "faults_by_kind": dict(Counter(f.kind for f in
                                                                      self.faults)),
            "convergence_budget_s": budget, "convergence": convergence,
            "faults": [asdict(f) for f in self.faults],
            "restart_s": {"count": len(self.restart_s),
                          "median": round(statistics.median(self.restart_s), 1)
                          if self.restart_s else None,
                          "max": round(max(self.restart_s), 1) if self.restart_s else None},
            "entries": {"accepted": s.accepted, "rejected": dict(sorted(s.rejected.items())),
                        "dropped": dict(sorted(s.dropped.items())),
                        "refused_in_audit_logs": dict(sorted(audit_refused.items()))},
            "corrupt_states": corrupt, "refused_on_restore": self.start_refused,
            "states": states, "exit_codes": exit_codes,
            "regressions": s.regressions, "cache_regressions": s.cache_regressions,
            "non_member_peer_rows": sorted(s.non_members), "max_peer_rows": s.max_peer_rows,
            "samples": s.samples, "status_failures": s.status_failures,
            "resources": s.resource_figures(warmup_s=min(120.0, duration / 5)),
            "agent": self.agent_results,
        }


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())


def verify_state(node: SoakNode) -> dict[str, Any]:
    """Load ``node``'s stopped state directory the way `peerd run` does at start-up (every
    file's checksum, every entry's signature and validity again) and report what failed."""
    from peerd.daemon.config import load_config
    from peerd.daemon.daemon import Daemon
    from peerd.store import ledgerfile

    capture = _Capture()
    logging.getLogger("peerd").addHandler(capture)
    try:
        blobs = len(list((node.dir / "blobs").glob("entry-*")))
        daemon = Daemon(load_config(node.config))
        counters = daemon.state.load_counters()
        ledger = ledgerfile.load(daemon.state)
    finally:
        logging.getLogger("peerd").removeHandler(capture)
    quarantine = node.dir / "quarantine"
    quarantined = sorted(p.name for p in quarantine.iterdir()) if quarantine.exists() else []
    problems = [m for m in capture.records if "not restoring" in m or "corrupt" in m]
    result = {"entries_on_disk": blobs, "restored": len(daemon.node.cache),
              "own_entry": daemon.node.own is not None, "round": counters.round,
              "version": counters.version, "counters_lost": counters.lost,
              "ledger": ledger is not None, "quarantined": quarantined, "problems": problems}
    result["ok"] = (not problems and not quarantined and not counters.lost
                    and ledger is not None and result["own_entry"]
                    and result["restored"] == blobs)
    return result


@contextmanager
def soak_mesh(cfg: SoakConfig, root: Path) -> Iterator[Soak]:
    with ExitStack() as stack:
        net = stack.enter_context(topology())
        soak = Soak(cfg, root, net)

        def stop_all() -> None:
            for node in soak.nodes:
                if node.alive():
                    node.stop()

        stack.callback(stop_all)
        yield soak


def run_soak(cfg: SoakConfig, root: Path) -> dict[str, Any]:
    assert PEERD  # the daemons run `python -m peerd.cli run` (mesh.Node.start)
    with soak_mesh(cfg, root) as soak:
        return soak.run()


def verdict(figures: dict[str, Any]) -> list[str]:
    """What failed, in words; empty when every invariant held."""
    problems = []
    if figures["corrupt_states"]:
        problems.append(f"{figures['corrupt_states']} corrupt state(s)")
    if figures["regressions"]:
        problems.append(f"{len(figures['regressions'])} round/version regressions")
    if figures["cache_regressions"]:
        problems.append(f"{len(figures['cache_regressions'])} cached-version regressions")
    if figures["non_member_peer_rows"]:
        problems.append(f"non-members in peer tables: {figures['non_member_peer_rows']}")
    stuck = [f for f in figures["faults"] if f["converge_s"] is None]
    if stuck:
        problems.append(f"not re-converged after {[(f['kind'], f['t']) for f in stuck]}")
    if any(code != 0 for code in figures["exit_codes"].values()):
        problems.append(f"exit codes {figures['exit_codes']}")
    return problems
