"""Flower's deployment runtime over a LAN of network namespaces, for
benchmarks/flower_vs_peerd_deploy.py.

Host 0 runs the SuperLink (``flower-superlink --insecure``: Fleet API on 9092, its HTTP
API on 127.0.0.1:8000) and every host one SuperNode (``flower-supernode --superlink
10.79.0.1:9092 --node-config 'partition-id=i num-partitions=N'``); ``flwr run`` from host 0
builds the app into a FAB, as Flower builds it, and submits it to the SuperLink, whose
ServerApp runs FedAvg. The line each ServerApp round logs is timestamped as it arrives; the
bytes are each host's ``eth0`` counters (so host 0's include the SuperLink's). With
``kill_after`` k the SuperLink gets SIGKILL once round k's global evaluation is logged.
As in benchmarks/_flower_sim.py, apps run in the given Flower environment
(``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``) instead of a fresh ``uv sync``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from peerd.mesh.netns import Host

ANSI = re.compile(r"\x1b\[[0-9;]*m")
GLOBAL = re.compile(r"MetricRecord: \{'accuracy': ([0-9.eE+-]+)")
CLIENT = re.compile(r"Aggregated MetricRecord: \{[^}]*'eval_acc': ([0-9.eE+-]+)")
LINK_CONFIG = ('[superlink]\ndefault = "deploy"\n\n[superlink.deploy]\n'
               'address = "127.0.0.1:8000"\ninsecure = true\n')


def eth0_bytes(host: Host) -> int:
    """rx + tx bytes on the host's only link."""
    out = subprocess.run(host.command(["cat", "/sys/class/net/eth0/statistics/rx_bytes",
                                       "/sys/class/net/eth0/statistics/tx_bytes"]),
                         capture_output=True, text=True, check=True).stdout.split()
    return sum(int(x) for x in out)


def _env(flower_python: Path, home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "PATH": f"{flower_python.parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _kill_the_rest(hosts: list[Host]) -> None:
    """Flower's own children that left our process groups (a ServerApp outlives its killed
    SuperLink, retrying): whatever still runs in the namespaces this run made."""
    for h in hosts:
        pids = subprocess.run(["ip", "netns", "pids", h.name], capture_output=True,
                              text=True, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def _wait_for_nodes(log: Path, n: int, link: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Until the SuperLink has activated all ``n`` SuperNodes (FedAvg samples the nodes
    connected when a round starts: a late one would sit the first rounds out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if link.poll() is not None:
            raise RuntimeError(f"the SuperLink exited: {log.read_text()[-2000:]}")
        if log.exists() and log.read_text(errors="replace").count("Activated node_id") >= n:
            return
        time.sleep(0.5)
    raise RuntimeError(f"not all {n} SuperNodes connected within {timeout_s:.0f} s")


def run_deployment(app: Path, work: Path, flower_python: Path, hosts: list[Host],
                   rounds: int, kill_after: int | None, timeout_s: float) -> dict[str, Any]:
    n = len(hosts)
    work.mkdir(parents=True)
    procs: list[subprocess.Popen[bytes]] = []
    start_bytes = [eth0_bytes(h) for h in hosts]
    t0 = time.monotonic()

    def spawn(host: Host, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        with (work / f"{name}.log").open("ab") as log:
            p = subprocess.Popen(host.command(argv), stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=_env(flower_python,
                                                                    work / name),
                                 start_new_session=True)
        procs.append(p)
        return p

    link = spawn(hosts[0], ["flower-superlink", "--insecure"], "superlink")
    try:
        for i, h in enumerate(hosts):
            spawn(h, ["flower-supernode", "--insecure", "--superlink",
                      f"{hosts[0].address}:9092", "--node-config",
                      f"partition-id={i} num-partitions={n}"], f"supernode{i}")
        cli = work / "cli"
        cli.mkdir()
        (cli / "config.toml").write_text(LINK_CONFIG)
        command = (f"flwr run . deploy --stream --run-config 'num-server-rounds={rounds}'")
        _wait_for_nodes(work / "superlink.log", n, link, timeout_s)
        up_s = round(time.monotonic() - t0, 1)
        run = subprocess.Popen(
            hosts[0].command(["bash", "-c", command]), cwd=app,
            env=_env(flower_python, cli), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True)
        timer = threading.Timer(timeout_s, run.kill)
        timer.start()
        glob: list[tuple[float, float]] = []
        client: list[tuple[float, float]] = []
        killed_at = None
        lines = []
        assert run.stdout is not None
        for raw in run.stdout:
            line = ANSI.sub("", raw.rstrip())
            lines.append(line)
            at = round(time.monotonic() - t0, 1)
            if m := CLIENT.search(line):
                client.append((at, float(m.group(1))))
            elif m := GLOBAL.search(line):
                glob.append((at, float(m.group(1))))
                if kill_after is not None and killed_at is None and len(glob) == kill_after:
                    link.send_signal(signal.SIGKILL)
                    killed_at = at
        run.wait()
        timer.cancel()
        end = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        _kill_the_rest(hosts)
    (work / "flwr-run.log").write_text("\n".join(lines) + "\n")
    return {"command": command, "exit": run.returncode, "seconds": round(end, 1),
            "supernodes_up_s": up_s,
            "killed_superlink_at_s": killed_at,
            "global_accuracy": glob, "client_eval_acc": client,
            "bytes": [eth0_bytes(h) - b for h, b in zip(hosts, start_bytes, strict=True)],
            "log_tail": lines[-6:]}
