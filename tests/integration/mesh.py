"""Real `peerd run` processes for integration tests: a fleet, configs, start/stop, status.

Each node gets its own state directory, key, control socket and config, all admitted to one
test fleet. Nodes run either on loopback (static peers, mDNS off: safe anywhere) or inside
network namespaces from ``tests.net.netns`` (mDNS on, confined to the namespaces).
Processes are always terminated at teardown, also when the test fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peerd.mesh.localmesh import DaemonProcess
from tests.inproc import peerd_inproc
from tests.net.netns import NetnsHost

PEERD = [sys.executable, "-m", "peerd.cli"]
#: Start-up imports torch, scikit-learn and libp2p: allow for a loaded 2-core CI machine.
STARTUP_TIMEOUT_S = 90.0


def peerd(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PEERD, *args], check=check, capture_output=True, text=True,
                          timeout=120)


@dataclass
class Node(DaemonProcess):
    name: str
    dir: Path
    id: str
    port: int
    host: NetnsHost | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return self.host.address if self.host else "127.0.0.1"

    def multiaddr(self) -> str:
        return f"/ip4/{self.address}/tcp/{self.port}/p2p/{self.id}"

    def start(self) -> None:
        argv = [*PEERD, "run", "--config", str(self.config)]
        if self.host is not None:
            argv = self.host.command(argv)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})


#: Ports a pytest-xdist worker moves loopback fleets by; five workers' fixed ports
#: (27100-27999 and up) stay below the ephemeral range.
XDIST_PORT_STRIDE = 1000
MAX_XDIST_WORKERS = 5


def port_offset() -> int:
    """0 outside pytest-xdist; worker ``gwN``'s own block of fixed ports inside it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker.removeprefix("gw"))
    assert index < MAX_XDIST_WORKERS, f"{worker}: fixed loopback ports would collide"
    return XDIST_PORT_STRIDE * index


def make_fleet(root: Path, n: int, *, hosts: list[NetnsHost] | None = None, mdns: bool = False,
               base_port: int = 27100, learning: dict[str, Any] | None = None,
               task: dict[str, Any] | None = None, admit: int | None = None) -> list[Node]:
    """n nodes of one fleet; only the first ``admit`` (default: all) are in its manifest,
    the rest are outsiders with a valid key and config but no membership.

    Ports are fixed (tests check them in logs and addresses) and below Linux's ephemeral
    range (32768-60999 by default): a fixed port inside it could already be the source port
    of some outbound connection, and the daemon would fail to listen ("Address already in
    use": seen once with 47600). On loopback, each pytest-xdist worker adds its own
    :func:`port_offset`: tests running at once must not share a port (namespaces each have
    their own ports)."""
    if hosts is None:
        base_port += port_offset()
    # The set-up commands in-process (tests/inproc.py): the daemons are the real processes.
    fleet = root / "fleet"
    peerd_inproc("fleet", "init", str(fleet))
    nodes: list[Node] = []
    for i in range(n):
        d = root / f"node{i}"
        out = peerd_inproc("keygen", "--state-dir", str(d)).stdout
        node_id = next(w for w in out.split() if w.startswith("12D3KooW"))
        if admit is None or i < admit:
            # node i is [task] node_index i: bound to that cordial agent (harmless elsewhere)
            peerd_inproc("fleet", "admit", "--fleet", str(fleet), node_id, "--agent", str(i))
        nodes.append(Node(f"node{i}", d, node_id, base_port + i, hosts[i] if hosts else None))
    for i, node in enumerate(nodes):
        peerd_inproc("init", "--fleet", str(fleet), "--state-dir", str(node.dir), "--socket",
                     str(node.socket), "--out", str(node.config), "--force")
        static = [] if mdns else [o.multiaddr() for o in nodes if o is not node]
        write_overrides(node.config, network={
            "listen_host": "0.0.0.0" if node.host else "127.0.0.1",
            "listen_port": node.port, "mdns": mdns, "static_peers": static,
        }, learning={"round_interval_s": 1.0, "tau_max": 120.0, **(learning or {})},
            task={"node_index": i, "node_count": n, **(task or {})})
    return nodes


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return repr(v)


def write_overrides(path: Path, **sections: dict[str, Any]) -> None:
    """Set keys in a `peerd init` config (uncommenting or replacing the default lines)."""
    lines = path.read_text().splitlines()
    current = ""
    out: list[str] = []
    pending = {k: dict(v) for k, v in sections.items()}
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            if current in pending:
                out += [f"{k} = {_toml(v)}" for k, v in pending.pop(current).items()]
            current = stripped[1:-1]
        else:
            body = stripped.lstrip("# ").split("=", 1)[0].strip()
            if current in pending and body in pending[current]:
                continue  # replaced below, at the end of the section
        out.append(line)
    if current in pending:
        out += [f"{k} = {_toml(v)}" for k, v in pending.pop(current).items()]
    for name, values in pending.items():
        out += [f"[{name}]", *(f"{k} = {_toml(v)}" for k, v in values.items())]
    path.write_text("\n".join(out) + "\n")


def wait_for(cond: Callable[[], bool], timeout: float, what: str, nodes: list[Node]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        for node in nodes:
            if node.proc is not None and node.proc.poll() is not None:
                raise AssertionError(f"{node.name} exited ({node.proc.returncode}) while "
                                     f"waiting for {what}:\n{node.logs()[-3000:]}")
        time.sleep(0.5)
    logs = "\n".join(f"--- {n.name}\n{n.logs()[-2000:]}" for n in nodes)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{logs}")


def audit(node: Node) -> list[dict[str, Any]]:
    """The node's audit log (``<state_dir>/audit.log``, JSON lines), oldest first."""
    path = node.dir / "audit.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cached_origins(node: Node) -> set[str]:
    s = node.status()
    return {c["origin"] for c in s["cache"]} if s else set()


def start(nodes: Iterable[Node], running: list[Node]) -> None:
    """Start ``nodes``, each recorded in ``running`` (the fixture that stops them)."""
    for node in nodes:
        node.start()
        running.append(node)


def status(node: Node) -> dict[str, Any]:
    """The node's status, which it must answer (else the failure shows its log)."""
    s = node.status()
    assert s is not None, f"{node.name} does not answer status:\n{node.logs()[-2000:]}"
    return s


def use_learner(node: Node, learner: dict[str, Any], *, run_config: dict[str, Any],
                node_config: dict[str, Any]) -> None:
    """Give ``node`` a ``[learner]`` (kind, entry, model, ...) with its two tables, and drop
    its ``[task]`` table: a python, flower or external learner reads its own data, and the
    config reader refuses a ``[task]`` beside one (even an empty one)."""
    lines = node.config.read_text().splitlines()
    kept: list[str] = []
    in_task = False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            in_task = stripped == "[task]"
        if not in_task:
            kept.append(line)
    node.config.write_text("\n".join(kept) + "\n")
    write_overrides(node.config, learner=learner, **{"learner.run_config": run_config,
                                                    "learner.node_config": node_config})
