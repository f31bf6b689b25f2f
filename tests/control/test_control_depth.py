"""Issue 24 item 4a: JSON nested past Python's recursion limit, in a request under 4 KiB,
gets the documented ``{"ok": false, ...}`` answer instead of a RecursionError that closed the
connection unanswered (and a traceback in the log); a response nested that deep is a
``bad_response`` for the CLI, not a crash."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from peerd.control.client import MAX_CONTROL_JSON_DEPTH, json_too_deep
from peerd.control.server import MAX_REQUEST_LEN, ControlError, dispatch, request
from tests.control.test_control import raw_exchange
from tests.daemon.helpers import running_server, sample_status

#: 1,500 levels: past CPython's default recursion limit of 1,000, in ~3 KB.
DEEP = b"[" * 1500 + b"]" * 1500


def test_a_deeply_nested_request_gets_the_documented_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    payload = b'{"api": 1, "method": "status", "x": ' + DEEP + b"}\n"
    assert len(payload) < MAX_REQUEST_LEN
    path = tmp_path / "peerd.sock"
    with running_server(path):
        answer = raw_exchange(path, payload)
        assert request(path, "status")  # the server still answers the next client
    assert answer["ok"] is False
    assert answer["error"]["code"] == "bad_request"
    assert f"deeper than {MAX_CONTROL_JSON_DEPTH}" in answer["error"]["message"]
    assert "RecursionError" not in caplog.text
    assert dispatch(DEEP, sample_status)["error"]["code"] == "bad_request"


def test_the_depth_prescan_counts_brackets_outside_strings_only() -> None:
    limit = MAX_CONTROL_JSON_DEPTH
    assert not json_too_deep(b"[" * limit + b"]" * limit)
    assert json_too_deep(b"[" * (limit + 1) + b"]" * (limit + 1))
    # Brackets in strings (escaped quotes included) are text: real requests pass.
    text = b'{"origin": "[[[[\\"' + b"[" * 100 + b'", "x": {"y": [1, {"z": "}}}"}]}}'
    assert not json_too_deep(text)
    assert dispatch(b'{"api": 1, "method": "status"}', sample_status)["ok"] is True


def test_a_deeply_nested_response_is_a_bad_response(tmp_path: Path) -> None:
    path = tmp_path / "fake.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)

    def fake_daemon() -> None:  # another program on the socket path
        conn, _ = srv.accept()
        conn.recv(100)
        conn.sendall(b'{"api": 1, "ok": true, "result": ' + DEEP + b"}\n")
        conn.close()

    t = threading.Thread(target=fake_daemon)
    t.start()
    try:
        with pytest.raises(ControlError) as exc:
            request(path, "status", timeout=5)
    finally:
        t.join(5)
        srv.close()
    assert exc.value.code == "bad_response"
    assert "deeper than" in exc.value.message
