"""A peerd mesh running examples/flower_app over a LAN of network namespaces, for
benchmarks/flower_vs_peerd_deploy.py: one ``peerd run`` per host (mDNS on, confined to the
namespaces), each with ``[learner] kind = "flower"``, its worker running the app's
ClientApp under the Flower interpreter with ``partition-id`` i of N. Asynchronous, as a
deployment is: each node runs a round every ``round_interval_s`` on its own clock.

Every second the status of each daemon is read (round, the ClientApp's own evaluation of its
latest trained model); bytes are each host's ``eth0`` counters, as for Flower. With
``kill`` = (node, round) that node's daemon gets SIGKILL (its worker dies with it) once its
status shows that round.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from benchmarks._daemons import Daemon, _toml, make_fleet
from benchmarks._flower_deploy import eth0_bytes
from peerd.mesh.netns import Host

#: Asynchronous rounds, 8 s apart; an entry older than 60 s leaves the blend (the killed
#: node's, a minute after it died); other settings as in the simulation comparison.
LEARNING: dict[str, Any] = {"capacity": 10, "tau_max": 60.0, "alpha": "examples",
                            "rho": 0.0, "lr": 0.1, "round_interval_s": 8.0}
RUN_CONFIG: dict[str, Any] = {"local-epochs": 2, "batch-size": 32, "learning-rate": 0.1,
                              "fraction-evaluate": 1.0}


def _config(d: Daemon, i: int, n: int, flower_python: Path) -> None:
    sections: dict[str, dict[str, Any]] = {
        "fleet": d.fleet,
        "node": {"state_dir": str(d.dir), "socket": str(d.socket), "torch_threads": 1},
        "network": {"listen_host": "0.0.0.0", "listen_port": d.port, "mdns": True},
        "learning": LEARNING,
        "learner": {"kind": "flower", "entry": "flowerapp.client_app:app",
                    "model": "flowerapp.task:Net", "device": "cpu",
                    "python": str(flower_python)},
        "learner.run_config": RUN_CONFIG,
        "learner.node_config": {"partition-id": i, "num-partitions": n},
    }
    d.config.write_text("".join(
        f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in values.items())
        for name, values in sections.items()))


def run_mesh(app: Path, work: Path, flower_python: Path, hosts: list[Host], target: float,
             max_s: float, kill: tuple[int, int] | None) -> dict[str, Any]:
    n = len(hosts)
    daemons = make_fleet(work, n, hosts=hosts)
    for i, d in enumerate(daemons):
        _config(d, i, n, flower_python)
    start_bytes = [eth0_bytes(h) for h in hosts]
    t0 = time.monotonic()
    samples: list[list[tuple[float, int, float | None]]] = [[] for _ in range(n)]
    killed_at = None
    reached: float | None = None
    ready: float | None = None  # every daemon answered its status: all started
    try:
        for d in daemons:
            d.start({"PYTHONPATH": str(app)})
        while time.monotonic() - t0 < max_s:
            time.sleep(1.0)
            at = round(time.monotonic() - t0, 1)
            live = []
            for i, d in enumerate(daemons):
                if killed_at is not None and kill is not None and i == kill[0]:
                    continue
                d.check_alive()
                st = d.status(timeout=5.0)
                if st is None:
                    continue
                node = st["node"]
                samples[i].append((at, node["round"], node["val_accuracy"]))
                live.append(node["val_accuracy"])
                if kill is not None and killed_at is None and i == kill[0] \
                        and node["round"] >= kill[1]:
                    d.stop(signal.SIGKILL)
                    killed_at = at
            alive = n - (killed_at is not None)
            if ready is None and len(live) == n:
                ready = at
            if reached is None and len(live) == alive and all(
                    a is not None and a >= target for a in live):
                reached = at
                break
        seconds = round(time.monotonic() - t0, 1)
        used = [eth0_bytes(h) - b for h, b in zip(hosts, start_bytes, strict=True)]
    finally:
        for d in daemons:
            d.stop()
    return {"settings": {**LEARNING, "run_config": RUN_CONFIG}, "target": target,
            "ready_s": ready, "reached_target_s": reached, "seconds": seconds, "killed": kill,
            "killed_at_s": killed_at, "samples": samples, "bytes": used}
