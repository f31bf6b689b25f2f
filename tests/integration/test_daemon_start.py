"""Start-up work that ends after READY=1 (issue 14): a real `peerd run` whose task's data
cannot be read sends READY=1 (the control socket and the host were up), then stops as a
start-up failure: one line on stderr, exit status 2 (systemd's unit does not restart it).
Loopback only, mDNS off; the test binds the ``$NOTIFY_SOCKET`` itself."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from peerd.mesh.localmesh import STOP_TIMEOUT_S
from tests.integration import late_task
from tests.integration.mesh import PEERD, STARTUP_TIMEOUT_S, make_fleet, write_overrides

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_data_failure_after_ready_stops_with_one_line_and_exit_2(
    tmp_path: Path, notify_socket: socket.socket
) -> None:
    (node,) = make_fleet(tmp_path, 1, base_port=free_port(),
                         task={"name": "tests.integration.late_task:task"})
    # Warnings and errors only: what is left on stderr is the failure's own line.
    write_overrides(node.config, node={"log_level": "warning"})
    proc = subprocess.Popen([*PEERD, "run", "--config", str(node.config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        messages: list[str] = []
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while "READY=1" not in messages and time.monotonic() < deadline:
            try:
                messages.append(notify_socket.recv(4096).decode())
            except TimeoutError:
                if proc.poll() is not None:
                    break
        _, stderr = proc.communicate(timeout=STOP_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "READY=1" in messages, f"no READY=1 before the failure: {messages}\n{stderr}"
    assert proc.returncode == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("peerd: task late_task: cannot load its data: ")
    assert late_task.MESSAGE in lines[0]
