"""Every start-up failure of the real `peerd run`: one line on stderr, exit status 2.

Each case starts the console command as a subprocess (as systemd does; exit status 2 is what
``RestartPreventExitStatus=2`` keeps from restarting) on loopback, mDNS off, and breaks one
thing: the key, the config, the manifest, the dataset, the port, the control socket, the
state directory's lock. The daemon must stop before it listens, say what is wrong in one
line and never print a traceback. Every failure that the config or the preflight checks
(:mod:`peerd.daemon.preflight`) find comes before torch, libp2p and the daemon are imported:
each case records which of them the process had loaded when it exited.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from peerd.store import lock as state_lock
from tests.inproc import peerd_inproc
from tests.integration.mesh import write_overrides

#: What the daemon needs and the checks before it must not: 4 to 5 s of CPU in imports.
HEAVY_MODULES = ("torch", "libp2p", "peerd.daemon.daemon")

#: ``python -m peerd.cli ARGS``, as the console command runs, which on exit (any status)
#: writes the :data:`HEAVY_MODULES` (and their submodules) it had imported, as JSON, to
#: the file named by $PEERD_TEST_IMPORTED.
RECORDING_MAIN = """
import atexit, json, os, runpy, sys
heavy = tuple(json.loads(os.environ["PEERD_TEST_HEAVY"]))
def record():
    with open(os.environ["PEERD_TEST_IMPORTED"], "w") as out:
        json.dump(sorted(m for m in sys.modules
                         if any(m == h or m.startswith(h + ".") for h in heavy)), out)
atexit.register(record)
runpy.run_module("peerd.cli", run_name="__main__", alter_sys=True)
"""
#: `peerd run` imports torch and libp2p before some failures: generous for a loaded machine.
RUN_TIMEOUT_S = 120.0


@dataclass
class Run:
    result: subprocess.CompletedProcess[str]
    heavy: list[str]  # the HEAVY_MODULES the process had imported when it exited


def peerd_run(config: Path, imported: Path) -> Run:
    env = {**os.environ, "PEERD_TEST_IMPORTED": str(imported),
           "PEERD_TEST_HEAVY": json.dumps(HEAVY_MODULES)}
    result = subprocess.run([sys.executable, "-c", RECORDING_MAIN, "run", "--config",
                             str(config)], capture_output=True, text=True,
                            timeout=RUN_TIMEOUT_S, env=env, check=False)
    return Run(result, json.loads(imported.read_text()))


@dataclass
class Node:
    """A working node (fleet, admitted key, config on loopback without mDNS) to break."""

    root: Path
    state: Path
    config: Path
    node_id: str

    @property
    def key(self) -> Path:
        return self.state / "node.key"

    @property
    def socket(self) -> Path:
        return self.state / "peerd.sock"


@pytest.fixture
def node(tmp_path: Path) -> Node:
    # In-process: only `peerd run` below is the subject, a real process as systemd runs it.
    fleet, state, config = tmp_path / "fleet", tmp_path / "state", tmp_path / "etc/peerd.toml"
    peerd_inproc("fleet", "init", str(fleet))
    node_id = peerd_inproc("keygen", "--state-dir", str(state)).stdout.strip()
    peerd_inproc("fleet", "admit", "--fleet", str(fleet), node_id)
    peerd_inproc("init", "--fleet", str(fleet), "--state-dir", str(state), "--out", str(config))
    write_overrides(config, network={"listen_host": "127.0.0.1", "listen_port": 0,
                                     "mdns": False})
    return Node(tmp_path, state, config, node_id)


def not_local_address() -> str:
    """An IPv4 address of no interface here (documentation ranges, RFC 5737)."""
    for candidate in ("203.0.113.77", "198.51.100.77", "192.0.2.177"):
        with socket.socket() as probe:
            try:
                probe.bind((candidate, 0))
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:
                    return candidate
    pytest.skip("every documentation address is assigned to an interface here")


@contextmanager
def listening_tcp() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield int(held.getsockname()[1])


@contextmanager
def listening_unix(path: Path) -> Iterator[None]:
    """A live socket at ``path``, as another daemon's control socket is."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as held:
        held.bind(str(path))
        held.listen()
        try:
            yield
        finally:
            path.unlink()


Breaker = Callable[[Node, ExitStack], None]


def garbage_key(n: Node, _: ExitStack) -> None:
    n.key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")


def loose_key(n: Node, _: ExitStack) -> None:
    n.key.chmod(0o644)


def key_is_a_directory(n: Node, _: ExitStack) -> None:
    n.key.unlink()
    n.key.mkdir()


def no_key(n: Node, _: ExitStack) -> None:
    n.key.unlink()


def port_in_use(n: Node, stack: ExitStack) -> None:
    write_overrides(n.config, network={"listen_port": stack.enter_context(listening_tcp())})


def metrics_port_in_use(n: Node, stack: ExitStack) -> None:
    port = stack.enter_context(listening_tcp())
    write_overrides(n.config, network={"metrics_listen": f"127.0.0.1:{port}"})


def socket_held(n: Node, stack: ExitStack) -> None:
    stack.enter_context(listening_unix(n.socket))


def state_dir_locked(n: Node, stack: ExitStack) -> None:
    stack.enter_context(state_lock.acquire(n.state))  # what a running daemon holds


def no_round_interval(n: Node, _: ExitStack) -> None:
    write_overrides(n.config, learning={"round_interval_s": 0})


def huge_capacity(n: Node, _: ExitStack) -> None:
    write_overrides(n.config, learning={"capacity": 99999999999})


def foreign_listen_host(n: Node, _: ExitStack) -> None:
    write_overrides(n.config, network={"listen_host": not_local_address()})


def missing_manifest(n: Node, _: ExitStack) -> None:
    (n.config.parent / "manifest.peerd").unlink()


def garbage_manifest(n: Node, _: ExitStack) -> None:
    manifest = n.config.parent / "manifest.peerd"
    manifest.chmod(0o644)
    manifest.write_bytes(b"not a manifest")


def missing_dataset(n: Node, _: ExitStack) -> None:
    write_overrides(n.config, task={"name": "csv", "csv_glob": str(n.root / "none/*.csv")})


def malformed_bootstrap(n: Node, _: ExitStack) -> None:
    write_overrides(n.config, network={
        "bootstrap": [f"/dns4/host.example/tcp/4011/p2p/{n.node_id}x"]})


def learn_relays_not_bool(n: Node, _: ExitStack) -> None:
    write_overrides(n.config, network={"learn_relays": "yes"})


def missing_config(n: Node, _: ExitStack) -> None:
    n.config.unlink()


def garbage_config(n: Node, _: ExitStack) -> None:
    n.config.write_text("[fleet\nadmin_public_key = 1\n")


CASES: dict[str, tuple[Breaker, str]] = {
    "garbage key": (garbage_key, "is not a PEM private key"),
    "key mode 0644": (loose_key, "has mode 0644; a private key must be 0600"),
    "key is a directory": (key_is_a_directory, "is not a regular file"),
    "no key": (no_key, "create one with `peerd keygen --state-dir"),
    "port in use": (port_in_use, "is already in use on 127.0.0.1"),
    "metrics port in use": (metrics_port_in_use, "metrics_listen 127.0.0.1:"),
    "control socket held": (socket_held, "another daemon is already listening on"),
    "state dir locked": (state_dir_locked, f"already running (pid {os.getpid()})"),
    "round_interval_s = 0": (no_round_interval, "round_interval_s: must be a finite number"),
    "capacity 99999999999": (huge_capacity, "capacity: must be an integer in [0, 511]"),
    "listen_host not local": (foreign_listen_host, "is not an address of this machine"),
    "missing manifest": (missing_manifest, "No such file"),
    "garbage manifest": (garbage_manifest, "no valid fleet manifest in"),
    "missing dataset": (missing_dataset, "no CSV files match"),
    "malformed bootstrap": (malformed_bootstrap, "[network] bootstrap: list item"),
    "learn_relays not a bool": (learn_relays_not_bool, "[network] learn_relays: must be"),
    "missing config": (missing_config, "cannot read config"),
    "garbage config": (garbage_config, "is not valid TOML"),
}
#: The failures the daemon finds as it starts (the manifest against the state, the task's
#: data): after the heavy imports. The config and the preflight checks find all the others.
FOUND_BY_DAEMON = {"missing manifest", "garbage manifest", "missing dataset"}


@pytest.mark.parametrize("case", list(CASES))
def test_a_start_up_failure_is_one_line_and_exit_2(node: Node, case: str) -> None:
    breaker, expected = CASES[case]
    with ExitStack() as stack:
        breaker(node, stack)
        run = peerd_run(node.config, node.root / "imported.json")
    result = run.result
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(lines) == 1, result.stderr  # nothing else: it stopped before it listened
    assert lines[0].startswith("peerd: ")
    assert expected in lines[0]
    assert not node.socket.exists() or case == "control socket held"
    # A config typo or a taken port is reported without 4 to 5 s of imports first (systemd
    # restart loops, an operator's retry); the daemon's own checks need them.
    if case not in FOUND_BY_DAEMON:
        assert run.heavy == [], f"imported before the preflight checks: {run.heavy[:5]}"
    else:
        assert {m.split(".")[0] for m in run.heavy} >= {"torch", "libp2p"}


def test_the_lock_file_names_the_holder_for_readers(tmp_path: Path) -> None:
    assert state_lock.holder(tmp_path) is None  # no lock file: nobody
    with state_lock.acquire(tmp_path, socket=tmp_path / "x.sock") as held:
        found = state_lock.holder(tmp_path)
        assert found == state_lock.LockHolder(os.getpid(), tmp_path / "x.sock")
        with pytest.raises(state_lock.StateLockError, match=rf"already running \(pid "
                           rf"{os.getpid()}\)"):
            state_lock.acquire(tmp_path)  # a second open file description: refused
        assert json.loads(held.path.read_text())["pid"] == os.getpid()  # not truncated
    assert state_lock.holder(tmp_path) is None  # released: the file stays, unlocked
