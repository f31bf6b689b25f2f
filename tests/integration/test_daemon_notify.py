"""A real `peerd run` process talks sd_notify(3) to a socket the test provides, as systemd would.

The test binds the ``$NOTIFY_SOCKET`` datagram socket itself (``Type=notify`` in
systemd/peerd.service) and checks the messages the daemon sends there: ``READY=1`` only once
it listens (its control socket answers and reports the listen address), then one
``STATUS=round N, ...`` line per round, and ``STOPPING=1`` on SIGTERM before a clean exit.
mDNS is off and the node listens on loopback only: nothing leaves this machine.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from peerd.mesh.localmesh import STOP_TIMEOUT_S
from tests.integration.mesh import STARTUP_TIMEOUT_S, Node, make_fleet

pytestmark = pytest.mark.integration

#: A round of the default digits task takes a few seconds on a loaded 2-core machine.
ROUND_TIMEOUT_S = 60.0
#: SIGTERM is handled at once on the event loop: STOPPING=1 comes well before the exit.
STOPPING_TIMEOUT_S = 20.0
#: Each recv is this short, so that a daemon that died is noticed between datagrams.
POLL_S = 0.5
ROUND = re.compile(r"\bround (\d+)\b")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """One daemon on loopback (mDNS off, no peers), rounds every second; always stopped."""
    (only,) = make_fleet(tmp_path, 1, base_port=free_port(),
                         learning={"round_interval_s": 1.0, "local_steps": 3})
    yield only
    only.stop()  # SIGTERM, SIGKILL after a timeout; a no-op once the test saw it exit


def receive(sock: socket.socket, node: Node, timeout: float, what: str) -> str:
    """The next datagram on ``sock``; fails if none comes in ``timeout`` or the daemon exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return sock.recv(4096).decode()
        except TimeoutError:
            if node.proc is None or node.proc.poll() is not None:
                code = None if node.proc is None else node.proc.returncode
                raise AssertionError(f"daemon exited ({code}) while waiting for {what}:\n"
                                     f"{node.logs()[-3000:]}") from None
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n"
                         f"{node.logs()[-3000:]}")


def test_daemon_notifies_ready_status_and_stopping(
    notify_socket: socket.socket, node: Node
) -> None:
    notify_socket.settimeout(POLL_S)
    started = time.monotonic()
    node.start()
    assert node.proc is not None

    # READY=1 is the first message, and only once the node listens and its control socket
    # is bound: a status request made right now is answered, with the listen address.
    first = receive(notify_socket, node, STARTUP_TIMEOUT_S, "READY=1")
    assert first == "READY=1", f"first sd_notify message was {first!r}, not READY=1"
    logs = node.logs()
    assert "listening on" in logs
    assert f"/tcp/{node.port}" in logs
    status = node.status()
    assert status is not None, "READY=1 sent before the control socket answers"
    assert status["node"]["id"] == node.id
    assert any(a.startswith("/ip4/127.0.0.1/") and f"/tcp/{node.port}" in a
               for a in status["node"]["listen"]), status["node"]["listen"]
    ready_after = time.monotonic() - started

    # STATUS= lines follow, one a round, each carrying the round number, which only grows.
    rounds: list[int] = []
    while not rounds or rounds[-1] < 2:
        message = receive(notify_socket, node, ROUND_TIMEOUT_S, "a STATUS=round N line")
        assert message.startswith("STATUS="), f"unexpected sd_notify message {message!r}"
        assert "\n" not in message
        found = ROUND.search(message)
        assert found is not None, f"STATUS line without a round number: {message!r}"
        rounds.append(int(found.group(1)))
    assert rounds[0] >= 1
    assert rounds == sorted(set(rounds)), f"round numbers not increasing: {rounds}"
    status = node.status()
    assert status is not None
    assert status["node"]["round"] >= rounds[-1]

    # SIGTERM: STOPPING=1 (after any STATUS lines of a round still finishing), then exit 0.
    node.proc.terminate()
    deadline = time.monotonic() + STOPPING_TIMEOUT_S
    while True:
        message = receive(notify_socket, node, max(0.1, deadline - time.monotonic()),
                          "STOPPING=1")
        if message == "STOPPING=1":
            break
        assert message.startswith("STATUS="), f"unexpected sd_notify message {message!r}"
    code = node.proc.wait(STOP_TIMEOUT_S)
    assert code == 0, f"exit status {code} after SIGTERM:\n{node.logs()[-3000:]}"
    assert "received SIGTERM" in node.logs()
    print(f"READY=1 after {ready_after:.1f} s, rounds {rounds}")
