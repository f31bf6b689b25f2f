"""Record the fixtures of test_status.py from two real daemons on loopback (not a test).

    .venv/bin/python -m tests.control.record_status tests/control/fixtures

writes ``status-starting.jsonl`` (the first answer of node 0's control socket: before its
first round ends, numbers are null) and ``status-running.jsonl`` (once it has cached the
other's entry, is connected and has done two rounds): each the exact line the socket sent.
Re-record only when the schema changes on purpose, and update docs/operations.md with it.
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile
import time
from pathlib import Path

from peerd.mesh.localmesh import local_mesh

#: Daemons import torch and libp2p first, then train: generous, but finite.
RECORD_TIMEOUT_S = 300.0


def answer(path: Path) -> bytes:
    """The raw status line of the control socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10.0)
        s.connect(str(path))
        s.sendall(b'{"api": 1, "method": "status"}\n')
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def record(out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="peerd-record-") as tmp, \
            local_mesh(Path(tmp), 2, use_netns=False) as nodes:
        deadline = time.monotonic() + RECORD_TIMEOUT_S
        first = True
        while time.monotonic() < deadline:
            try:
                line = answer(nodes[0].socket)
            except OSError:
                time.sleep(0.002)  # poll fast: the first round takes well under a second
                continue
            if first:
                (out / "status-starting.jsonl").write_bytes(line)
                first = False
            result = json.loads(line)["result"]
            if (result["cache"] and result["node"]["round"] >= 2
                    and result["cache"][0]["alpha"] is not None  # blended, not just arrived
                    and any(p["connected"] for p in result["peers"])):
                (out / "status-running.jsonl").write_bytes(line)
                return
            time.sleep(0.5)
    raise SystemExit(f"no exchange within {RECORD_TIMEOUT_S:.0f} s")


if __name__ == "__main__":
    record(Path(sys.argv[1]))
