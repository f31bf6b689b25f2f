"""A live mesh of real `peerd run` daemons on one machine (what `peerd demo` shows).

It makes a throw-away fleet (a fleet directory, through peerd.store.fleetdir: admin key, one
key per node, a signed manifest admitting all), writes each node a config and starts the
daemons as separate processes. As root the nodes live in network namespaces on a private
bridge and find each other by mDNS alone; without root they run on loopback with static
peers and mDNS off, because multicast from the root namespace would reach the real network.

It must not read a daemon's state or the fleet files itself: it asks each daemon over its
control socket (:mod:`peerd.control`) and makes the fleet with :mod:`peerd.store.fleetdir`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peerd.control.server import ControlError, request
from peerd.control.status import Status, from_json
from peerd.mesh import netns
from peerd.store import fleetdir

#: Port every daemon listens on (each namespace has its own port space); loopback adds i.
BASE_PORT = 4011
#: A daemon that will not stop on SIGTERM within this is killed.
STOP_TIMEOUT_S = 20.0
#: Log lines a failure report shows of a daemon that died.
TAIL_LINES = 12


def daemon_argv(*args: str) -> list[str]:
    """``peerd ARGS`` run by this very installation, immune to the working directory.

    The console script beside our interpreter when there is one (a venv, pipx); otherwise
    the interpreter with ``-P``, so ``-m peerd.cli`` never picks up a ``peerd`` package from
    the working directory (a source checkout would shadow the installed one).
    """
    script = Path(sys.executable).with_name("peerd")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), *args]
    return [sys.executable, "-P", "-m", "peerd.cli", *args]


class DaemonProcess:
    """One `peerd run` process whose config, control socket and log live in ``dir``.

    Shared by the demo, the integration tests and the benchmarks, which differ only in how
    they lay out fleets and start processes.
    """

    dir: Path
    proc: subprocess.Popen[bytes] | None

    @property
    def config(self) -> Path:
        return self.dir / "peerd.toml"

    @property
    def socket(self) -> Path:
        return self.dir / "peerd.sock"

    @property
    def log(self) -> Path:
        return self.dir / "peerd.log"

    def status(self, timeout: float = 10.0) -> dict[str, Any] | None:
        """The daemon's status JSON over its control socket (what `peerd status --json`
        prints), or None while it is not up. Checked against the schema on every call
        (:class:`~peerd.control.status.StatusError` if it drifted), so every test and
        benchmark that polls a daemon also checks what the daemon serves."""
        try:
            result = request(self.socket, "status", timeout=timeout)
        except ControlError:
            return None
        from_json(result)
        return result

    def poll(self, timeout: float = 10.0) -> Status | None:
        """The daemon's status, decoded, or None while it is not up."""
        result = self.status(timeout)
        return None if result is None else from_json(result)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = TAIL_LINES) -> list[str]:
        """The last ``lines`` lines of the daemon's log (what a failure report shows)."""
        return self.logs().splitlines()[-lines:]

    def exit_code(self) -> int | None:
        """The exit status once the process has ended; None while it runs (or never ran)."""
        return None if self.proc is None else self.proc.poll()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """Signal the process and wait (SIGKILL after ``timeout``); its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        code = self.proc.returncode
        self.proc = None
        return code


@dataclass
class MeshNode(DaemonProcess):
    index: int
    dir: Path
    id: str
    port: int
    host: netns.Host | None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return self.host.address if self.host else "127.0.0.1"


def _toml(value: object) -> str:
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


def _tables(name: str, section: Mapping[str, object]) -> list[str]:
    """``[name]`` with its keys, then each value that is a table as ``[name.key]``."""
    tables = {k: v for k, v in section.items() if isinstance(v, Mapping)}
    return [f"[{name}]", *(f"{k} = {_toml(v)}" for k, v in section.items() if k not in tables),
            *(line for k, v in tables.items() for line in _tables(f"{name}.{k}", v))]


def _config(node: MeshNode, fleet: fleetdir.Fleet, *, static: list[str], mdns: bool, n: int,
            task: str, learning: dict[str, object], model: str | None = None) -> str:
    lines = [
        "# written by `peerd demo`",
        "[fleet]",
        *(f"{k} = {_toml(v)}" for k, v in fleet.config_section().items()),
        "[node]",
        f"state_dir = {_toml(str(node.dir))}",
        f"socket = {_toml(str(node.socket))}",
        "[network]",
        # In a namespace the only non-loopback interface is the private bridge.
        f"listen_host = {_toml('0.0.0.0' if node.host else '127.0.0.1')}",  # noqa: S104
        f"listen_port = {node.port}",
        f"mdns = {_toml(mdns)}",
        f"static_peers = [{', '.join(_toml(s) for s in static)}]",
        *_tables("learning", learning),
        "[task]",
        f"name = {_toml(task)}",
        f"node_index = {node.index}",
        f"node_count = {n}",
        *([] if model is None else [f"model = {_toml(model)}"]),
    ]
    return "\n".join(lines) + "\n"


@contextmanager
def local_mesh(
    root: Path, n: int, *, task: str = "digits", use_netns: bool | None = None,
    learning: dict[str, object] | None = None,
    env: Sequence[Mapping[str, str]] | None = None,
    models: Sequence[str | None] | None = None,
) -> Iterator[list[MeshNode]]:
    """Create and start ``n`` daemons under ``root``; stop them and clean up on exit.

    ``env``: extra environment variables per node (a user task's data folder, its
    ``PYTHONPATH``). ``models``: ``[task] model`` per node, cycled (knowledge mode lets
    them differ). Each daemon runs in its own directory, never in the caller's.
    """
    if env is not None and len(env) != n:
        raise ValueError(f"env has {len(env)} entries for {n} nodes")
    if use_netns is None:
        use_netns = netns.unavailable() is None
    with ExitStack() as stack:
        hosts = stack.enter_context(netns.lan(n, net=78, prefix="peerd-demo")) if use_netns \
            else [None] * n
        dirs = [root / f"node{i}" for i in range(n)]
        fleet, ids = fleetdir.create_with_nodes(root / "fleet", dirs)
        nodes = [MeshNode(i, d, node_id, BASE_PORT + (0 if host else i), host)
                 for i, (d, node_id, host) in enumerate(zip(dirs, ids, hosts, strict=True))]
        defaults: dict[str, object] = {"round_interval_s": 2.0, "tau_max": 60.0,
                                       "capacity": max(1, n - 1), "alpha": "examples"}
        for node in nodes:
            static = [] if use_netns else [
                f"/ip4/{o.address}/tcp/{o.port}/p2p/{o.id}" for o in nodes if o is not node]
            node.config.write_text(_config(
                node, fleet, static=static, mdns=use_netns, n=n, task=task,
                learning={**defaults, **(learning or {})},
                model=models[node.index % len(models)] if models else None))
        stack.callback(_stop_all, nodes)
        for node in nodes:
            argv = daemon_argv("run", "--config", str(node.config))
            if node.host is not None:
                argv = node.host.command(argv)
            extra = env[node.index] if env is not None else {}
            with node.log.open("ab") as out:
                node.proc = subprocess.Popen(  # noqa: S603 - our own installation and args
                    argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONUNBUFFERED": "1", **extra},
                    cwd=node.dir,  # neutral: nothing there can shadow the installed peerd
                    start_new_session=True)  # Ctrl-C in the terminal reaches us, not them
        yield nodes


def _stop_all(nodes: list[MeshNode]) -> None:
    # Signal every daemon first, then wait: they shut down in parallel.
    for node in nodes:
        if node.alive():
            assert node.proc is not None
            node.proc.send_signal(signal.SIGTERM)
    for node in nodes:
        node.stop(timeout=STOP_TIMEOUT_S)
