"""Real `peerd run` processes for benchmarks: a throw-away fleet, configs, start/stop, logs.

Each daemon gets its own state directory, key, control socket and config, all admitted to
one fresh fleet. Daemons run on loopback (static peers, mDNS off) or inside network
namespaces from ``tests.net.netns`` (mDNS on, confined to the namespaces).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from peerd.mesh.localmesh import DaemonProcess

REPO = Path(__file__).resolve().parent.parent
POLL_S = 0.25
#: A daemon that does not stop on SIGTERM within this is killed.
STOP_TIMEOUT_S = 30.0
#: ``logging`` lines as `peerd run` writes them: asctime (local, ms), level, logger, message.
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+: (.*)$")


@dataclass
class Daemon(DaemonProcess):
    name: str
    dir: Path
    id: str
    port: int
    address: str = "127.0.0.1"
    netns: Any = None  # tests.net.netns.NetnsHost when in a namespace
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0  # time.time() at Popen
    #: The [fleet] section of its config (admin key, fleet id, manifest path).
    fleet: dict[str, str] = field(default_factory=dict)
    #: The tree it runs from: `python -m` puts the working directory first on sys.path, so
    #: this checkout, or an exported older revision (benchmarks._startup.exported).
    source: Path = REPO

    def multiaddr(self) -> str:
        return f"/ip4/{self.address}/tcp/{self.port}/p2p/{self.id}"

    def start(self, env: dict[str, str]) -> None:
        argv = [sys.executable, "-m", "peerd.cli", "run", "--config", str(self.config)]
        if self.netns is not None:
            argv = self.netns.command(argv)
        with self.log.open("ab") as out:
            self.started_at = time.time()
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.source,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1", **env})

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited:\n{self.logs()[-3000:]}")

    def proc_status(self) -> dict[str, int]:
        """VmRSS / VmHWM / RssAnon / RssFile (bytes) of the daemon's process."""
        assert self.proc is not None
        return vm_of(Path(f"/proc/{self.proc.pid}/status").read_text())

    def events(self) -> list[tuple[float, str]]:
        """(seconds since start, message) for each log line."""
        out = []
        for line in self.logs().splitlines():
            m = LOG_LINE.match(line)
            if m:
                at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                out.append((at - self.started_at, m.group(2)))
        return out


def vm_of(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


#: Run in an exported older tree: its own fleet, in its own manifest format.
_FLEET_IN_SOURCE = """
import json, sys
from pathlib import Path
from peerd.store.fleetdir import create_with_nodes
fleet, ids = create_with_nodes(Path(sys.argv[1]), [Path(d) for d in sys.argv[2:]])
print(json.dumps({"fleet": fleet.config_section(), "ids": ids}))
"""


def make_fleet(root: Path, n: int, *, hosts: list[Any] | None = None,
               source: Path = REPO) -> list[Daemon]:
    """n members of one fresh fleet (``root/fleet``): keys, a signed manifest admitting all,
    state dirs ``root/node<i>``, for daemons run from ``source``. An older tree's fleet is
    made by that tree's code: a manifest format can grow (a field per member), and an older
    daemon refuses a manifest of a newer one."""
    dirs = [root / f"node{i}" for i in range(n)]
    if source == REPO:
        from peerd.store.fleetdir import create_with_nodes

        made, ids = create_with_nodes(root / "fleet", dirs)
        section = made.config_section()
    else:  # `python -c` in the tree puts it first on sys.path, as Daemon.start's `-m` does
        out = subprocess.run([sys.executable, "-c", _FLEET_IN_SOURCE, str(root / "fleet"),
                              *map(str, dirs)], cwd=source, capture_output=True, text=True,
                             check=True, timeout=120)
        made_there = json.loads(out.stdout.splitlines()[-1])
        section, ids = made_there["fleet"], made_there["ids"]
    daemons = []
    for i, (d, node_id) in enumerate(zip(dirs, ids, strict=True)):
        host = hosts[i] if hosts else None
        daemons.append(Daemon(f"node{i}", d, node_id, free_port() if host is None
                              else 4011, host.address if host else "127.0.0.1", host,
                              fleet=section, source=source))
    return daemons


def write_config(d: Daemon, *, static: list[Daemon], mdns: bool, learning: dict[str, Any],
                 task: dict[str, Any]) -> None:
    sections: dict[str, dict[str, Any]] = {
        "fleet": d.fleet,
        "node": {"state_dir": str(d.dir), "socket": str(d.socket), "torch_threads": 1},
        # In a namespace the only non-loopback interface is the private bridge.
        "network": {"listen_host": "0.0.0.0" if d.netns else "127.0.0.1",
                    "listen_port": d.port, "mdns": mdns,
                    "static_peers": [o.multiaddr() for o in static]},
        "learning": learning,
        "task": task,
    }
    d.config.write_text("".join(
        f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in values.items())
        for name, values in sections.items()))


@contextmanager
def running(daemons: list[Daemon]) -> Iterator[list[Daemon]]:
    try:
        yield daemons
    finally:
        for d in daemons:
            d.stop()


def wait_for(cond: Callable[[], bool], timeout: float, what: str, daemons: list[Daemon],
             every: Callable[[], None] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if every is not None:
            every()
        if cond():
            return
        for d in daemons:
            d.check_alive()
        time.sleep(POLL_S)
    logs = "\n".join(f"--- {d.name}\n{d.logs()[-2000:]}" for d in daemons)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}\n{logs}")
