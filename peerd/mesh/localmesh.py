"""A live mesh of real `peerd run` daemons on one machine (what `peerd demo` shows).

It makes a throw-away fleet (admin key, one key per node, a signed manifest admitting all),
writes each node a config and starts the daemons as separate processes. As root the nodes
live in network namespaces on a private bridge and find each other by mDNS alone; without
root they run on loopback with static peers and mDNS off, because multicast from the root
namespace would reach the real network.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.control.server import ControlError, request
from peerd.mesh import netns
from peerd.protocol.identity import node_id_of, public_key_bytes
from peerd.protocol.limits import FLEET_ID_LEN
from peerd.protocol.manifest import Manifest, encode_manifest_file
from peerd.store.keyfile import NODE_KEY_FILE, atomic_write, write_private_key

#: Port every daemon listens on (each namespace has its own port space); loopback adds i.
BASE_PORT = 4011
#: A daemon that will not stop on SIGTERM within this is killed.
STOP_TIMEOUT_S = 20.0


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
        """The daemon's status over its control socket (what `peerd status --json` prints),
        or None while it is not up."""
        try:
            return request(self.socket, "status", timeout=timeout)
        except ControlError:
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

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


def _config(node: MeshNode, fleet_id: bytes, admin: bytes, manifest: Path, *,
            static: list[str], mdns: bool, n: int, task: str, learning: dict[str, object]
            ) -> str:
    lines = [
        "# written by `peerd demo`",
        "[fleet]",
        f"admin_public_key = {_toml(admin.hex())}",
        f"fleet_id = {_toml(fleet_id.hex())}",
        f"manifest = {_toml(str(manifest))}",
        "[node]",
        f"state_dir = {_toml(str(node.dir))}",
        f"socket = {_toml(str(node.socket))}",
        "[network]",
        # In a namespace the only non-loopback interface is the private bridge.
        f"listen_host = {_toml('0.0.0.0' if node.host else '127.0.0.1')}",  # noqa: S104
        f"listen_port = {node.port}",
        f"mdns = {_toml(mdns)}",
        f"static_peers = [{', '.join(_toml(s) for s in static)}]",
        "[learning]",
        *(f"{k} = {_toml(v)}" for k, v in learning.items()),
        "[task]",
        f"name = {_toml(task)}",
        f"node_index = {node.index}",
        f"node_count = {n}",
    ]
    return "\n".join(lines) + "\n"


@contextmanager
def local_mesh(
    root: Path, n: int, *, task: str = "digits", use_netns: bool | None = None,
    learning: dict[str, object] | None = None,
) -> Iterator[list[MeshNode]]:
    """Create and start ``n`` daemons under ``root``; stop them and clean up on exit."""
    if use_netns is None:
        use_netns = netns.unavailable() is None
    with ExitStack() as stack:
        hosts = stack.enter_context(netns.lan(n, net=78, prefix="peerd-demo")) if use_netns \
            else [None] * n
        admin = Ed25519PrivateKey.generate()
        fleet_id = secrets.token_bytes(FLEET_ID_LEN)
        manifest = Manifest(fleet_id, 0)
        nodes = []
        for i, host in enumerate(hosts):
            key = Ed25519PrivateKey.generate()
            d = root / f"node{i}"
            write_private_key(d / NODE_KEY_FILE, key)
            manifest = manifest.admit(public_key_bytes(key), None)
            nodes.append(MeshNode(i, d, node_id_of(key), BASE_PORT + (0 if host else i), host))
        manifest_path = root / "manifest.peerd"
        atomic_write(manifest_path, encode_manifest_file(manifest.sign(admin)), mode=0o644,
                     overwrite=True)
        defaults: dict[str, object] = {"round_interval_s": 2.0, "tau_max": 60.0,
                                       "capacity": max(1, n - 1), "alpha": "examples"}
        for node in nodes:
            static = [] if use_netns else [
                f"/ip4/{o.address}/tcp/{o.port}/p2p/{o.id}" for o in nodes if o is not node]
            node.config.write_text(_config(
                node, fleet_id, public_key_bytes(admin), manifest_path, static=static,
                mdns=use_netns, n=n, task=task, learning={**defaults, **(learning or {})}))
        stack.callback(_stop_all, nodes)
        for node in nodes:
            argv = [sys.executable, "-m", "peerd.cli", "run", "--config", str(node.config)]
            if node.host is not None:
                argv = node.host.command(argv)
            with node.log.open("ab") as out:
                node.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and args
                    argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
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
