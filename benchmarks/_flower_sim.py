"""Flower's own simulation of examples/flower_app, for benchmarks/flower_vs_peerd.py.

``flwr run`` of the app directory as Flower's quickstart runs it: a local SuperLink in
simulation mode (``flower-superlink --simulation``) that runs the ServerApp's FedAvg and the
ClientApps on Flower's Ray backend, N simulated SuperNodes, each given ``partition-id`` i
of ``num-partitions`` N as its node_config. Nothing here aggregates or trains: the numbers
are what Flower's ServerApp logs.

Two changes to how ``flwr run`` starts by default, neither touching what it computes:
* the run happens in a network namespace of its own (``unshare -n``, loopback only): the
  local SuperLink listens on fixed ports (39091, 39093, 9091…) that another run on the
  machine may hold; and this command starts that SuperLink itself, with the command line
  ``flwr`` would use, so that it is a child to stop afterwards (``flwr`` leaves its own
  running, detached);
* ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``: the app runs in the Flower
  environment given (``--flower-python``), which has torch and scikit-learn, instead of a
  fresh ``uv sync`` from the package index (a second torch download per run).
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

#: Flower's local SuperLink, as ``flwr`` starts it (flwr/cli/local_superlink.py, 1.39).
SUPERLINK = ("flower-superlink --insecure --simulation --isolation subprocess "
             "--control-api-address 127.0.0.1:39093 --host 127.0.0.1 --port 39091")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: The app's ServerApp prints its per-round centralized evaluation last (server_app.py).
SERVER_LINE = "Server-side evaluation per round: "
EVAL_ACC = re.compile(r"Aggregated MetricRecord: \{[^}]*'eval_acc': ([0-9.eE+-]+)")
STRATEGY_S = re.compile(r"Strategy execution finished in ([0-9.]+)s")


def script(app: Path, home: Path, nodes: int, rounds: int, cpus: int) -> tuple[str, str]:
    """The bash run inside the namespace (loopback up, our SuperLink, ``flwr run``) and the
    ``flwr run`` command in it."""
    run = (f"flwr run {shlex.quote(str(app))} --stream "
           f"--federation-config 'num-supernodes={nodes} init-args-num-cpus={cpus}' "
           f"--run-config 'num-server-rounds={rounds}'")
    return "\n".join([
        "set -u",
        "ip link set lo up",
        f"{SUPERLINK} --log-file {shlex.quote(str(home / 'superlink.log'))} "
        f"> {shlex.quote(str(home / 'superlink.out'))} 2>&1 &",
        "link=$!",
        "trap 'kill $link 2>/dev/null; wait $link 2>/dev/null' EXIT",
        "for _ in $(seq 150); do curl -sf http://127.0.0.1:39091/health >/dev/null && break;"
        " sleep 0.2; done",
        run,
    ]), run


def run_flower(app: Path, work: Path, flower_python: Path, nodes: int, rounds: int,
               cpus: int, timeout_s: float) -> dict[str, Any]:
    """One ``flwr run`` of ``app``; its per-round numbers and the command that made them."""
    home = work / "flwr-home"
    home.mkdir(parents=True)
    bash, command = script(app, home, nodes, rounds, cpus)
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_UPDATE_CHECK": "1",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "PATH": f"{flower_python.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    t0 = time.perf_counter()
    proc = subprocess.run(["unshare", "-n", "bash", "-c", bash], env=env, cwd=app,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    wall = time.perf_counter() - t0
    log = ANSI.sub("", proc.stdout + proc.stderr)
    (work / "flwr-run.log").write_text(log)
    if proc.returncode != 0 or SERVER_LINE not in log:
        tail = "\n".join(log.splitlines()[-15:])
        raise RuntimeError(f"flwr run failed (exit {proc.returncode}):\n{tail}")
    return {"command": command, "wall_s": round(wall, 1), **parse(log, rounds)}


def parse(log: str, rounds: int) -> dict[str, Any]:
    """The ServerApp's centralized accuracy of the global model per round (0: the initial
    model) and the ClientApps' weighted evaluation accuracy per round, from its log."""
    line = next(x for x in log.splitlines() if x.startswith(SERVER_LINE))
    server: dict[int, dict[str, float]] = ast.literal_eval(line[len(SERVER_LINE):])
    client = [float(a) for a in EVAL_ACC.findall(log)]
    if sorted(server) != list(range(rounds + 1)) or len(client) != rounds:
        raise RuntimeError(f"flwr run logged {sorted(server)} server rounds and "
                           f"{len(client)} client evaluations, not {rounds}")
    strategy = STRATEGY_S.search(log)
    return {"central_accuracy": [server[r]["accuracy"] for r in range(rounds + 1)],
            "central_loss": [server[r]["loss"] for r in range(rounds + 1)],
            "client_eval_acc": client,
            "strategy_s": None if strategy is None else float(strategy.group(1))}
