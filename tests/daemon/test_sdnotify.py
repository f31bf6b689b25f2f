"""sd_notify messages, received on a datagram socket the test provides (as systemd would)."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest

from peerd.daemon import sdnotify

#: Bound on waiting for a datagram that was sent synchronously: only a bug makes us wait.
RECV_TIMEOUT_S = 2.0


def recv(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_ready_status_stopping_watchdog(notify_socket: socket.socket) -> None:
    assert sdnotify.ready()
    assert recv(notify_socket) == "READY=1"
    assert sdnotify.status("round 3")
    assert recv(notify_socket) == "STATUS=round 3"
    assert sdnotify.stopping()
    assert recv(notify_socket) == "STOPPING=1"
    assert sdnotify.watchdog()
    assert recv(notify_socket) == "WATCHDOG=1"


def test_status_is_one_bounded_line(notify_socket: socket.socket) -> None:
    sdnotify.status("round 4\nREADY=1")  # a newline must not smuggle in a second assignment
    assert recv(notify_socket) == "STATUS=round 4 READY=1"
    sdnotify.status("x" * 10_000)
    assert len(recv(notify_socket)) == len("STATUS=") + sdnotify.MAX_STATUS_LEN


def test_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"peerd-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(RECV_TIMEOUT_S)
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    try:
        assert sdnotify.ready()
        assert recv(sock) == "READY=1"
    finally:
        sock.close()


def test_no_op_without_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.ready() is False


def test_unreachable_socket_is_not_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert sdnotify.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", "relative/path")
    assert sdnotify.ready() is False
