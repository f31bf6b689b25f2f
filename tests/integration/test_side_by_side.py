"""Two nodes on one machine that differ only in their state directory (issue 13): `peerd
init` + `peerd run` twice, side by side, each with its own socket (derived from its state
directory) and `peerd status --state-dir` showing each its own node; a second `peerd run` of
a state directory in use stops at once, exit status 2, "already running (pid N)".

Loopback only, mDNS off: safe in the root network namespace."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.mesh import (
    PEERD,
    STARTUP_TIMEOUT_S,
    Node,
    cached_origins,
    make_fleet,
    peerd,
    start,
    wait_for,
    write_overrides,
)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in started:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def status_of(state: Path) -> subprocess.CompletedProcess[str]:
    return peerd("status", "--json", "--state-dir", str(state), check=False)


def wait_running(state: Path, proc: subprocess.Popen[bytes], log: Path) -> dict[str, object]:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        answer = status_of(state)
        if answer.returncode == 0:
            doc: dict[str, object] = json.loads(answer.stdout)
            return doc
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"not answering after {STARTUP_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def test_two_state_dirs_run_side_by_side_and_a_third_run_is_refused(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    fleet = tmp_path / "fleet"
    peerd("fleet", "init", str(fleet))
    names = ("a", "b")
    ids, configs = {}, {}
    for name in names:
        ids[name] = peerd("keygen", "--state-dir", str(tmp_path / name)).stdout.strip()
        peerd("fleet", "admit", "--fleet", str(fleet), ids[name])
    for name in names:
        configs[name] = tmp_path / f"etc-{name}" / "peerd.toml"
        peerd("init", "--fleet", str(fleet), "--state-dir", str(tmp_path / name),
              "--out", str(configs[name]))
        write_overrides(configs[name], network={"listen_host": "127.0.0.1", "listen_port": 0,
                                                "mdns": False})
    # Only the state directory tells the two configs apart (no --socket was given).
    lines = {n: configs[n].read_text().splitlines() for n in names}
    differ = [(x, y) for x, y in zip(lines["a"], lines["b"], strict=True) if x != y]
    assert differ == [(f'state_dir = "{tmp_path / "a"}"', f'state_dir = "{tmp_path / "b"}"'),
                      (f'# socket = "{tmp_path / "a/peerd.sock"}"',
                       f'# socket = "{tmp_path / "b/peerd.sock"}"')]
    logs = {n: tmp_path / f"{n}.log" for n in names}
    running = {}
    for name in names:
        with logs[name].open("wb") as out:
            running[name] = subprocess.Popen([*PEERD, "run", "--config", str(configs[name])],
                                             stdout=out, stderr=subprocess.STDOUT)
        procs.append(running[name])
    for name in names:
        shown = wait_running(tmp_path / name, running[name], logs[name])
        node = shown["node"]
        assert isinstance(node, dict)
        assert node["id"] == ids[name]  # its own node, never the other's
    assert (tmp_path / "a/peerd.sock").exists()
    assert (tmp_path / "b/peerd.sock").exists()

    again = peerd("run", "--config", str(configs["a"]), check=False)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"peerd: already running (pid {running['a'].pid}): another peerd holds "
        f"{tmp_path / 'a'}; give each daemon its own --state-dir"]
    assert running["a"].poll() is None  # the first one is untouched

    for name in names:
        running[name].send_signal(signal.SIGTERM)
        assert running[name].wait(timeout=60) == 0
        assert "stopped: node" in logs[name].read_text()
    offline = status_of(tmp_path / "a")
    assert offline.returncode == 3  # not running: the state directory, offline
    assert json.loads(offline.stdout)["node"]["id"] == ids["a"]


def test_the_log_tells_connections_entries_and_the_stop(
    tmp_path: Path, running: list[Node]
) -> None:
    a, b = make_fleet(tmp_path, 2, base_port=27230)
    start((a, b), running)
    wait_for(lambda: b.id in cached_origins(a) and a.id in cached_origins(b), 120,
             "each daemon to cache the other's entry", [a, b])
    assert b.stop() == 0
    wait_for(lambda: f"disconnected from …{b.id[-6:]}" in a.logs(), 60,
             "a to log b's disconnection", [a])
    assert a.stop() == 0
    log = a.logs()
    # The peer's short id (as `peerd status` shows it) and the address of the connection.
    assert re.search(rf"connected to …{b.id[-6:]} at 127\.0\.0\.1:\d+", log), log[-3000:]
    assert re.search(rf"disconnected from …{b.id[-6:]} at 127\.0\.0\.1:\d+", log)
    assert f"listening on /ip4/127.0.0.1/tcp/{a.port} as" in log
    assert re.search(rf"received \d+ entr(y|ies) from …{b.id[-6:]}", log)
    assert "received 1 entries" not in log
    assert log.rstrip().splitlines()[-1].split(": ", 1)[1].startswith(f"stopped: node {a.id}")
