"""Issue 24 item 4c: a state directory others could read or write is warned about at start
(one line naming the directory, its mode and the fix), not only tightened in silence; a key
file readable by others stays refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.store.keyfile import KeyFileError, read_private_key, write_private_key
from peerd.store.statedir import StateDir


def _start(path: Path, mode: int, caplog: pytest.LogCaptureFixture) -> list[str]:
    path.mkdir(exist_ok=True)
    os.chmod(path, mode)
    caplog.clear()
    with caplog.at_level("WARNING", logger="peerd.store.statedir"):
        StateDir(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700  # tightened, as before
    return [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(("mode", "what"), [
    (0o777, "group-writable, world-writable, world-readable"),
    (0o720, "group-writable"),
    (0o704, "world-readable"),
])
def test_an_exposed_state_directory_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int, what: str
) -> None:
    state = tmp_path / "state"
    (line,) = _start(state, mode, caplog)
    assert "\n" not in line
    assert str(state) in line
    assert f"{mode:04o} ({what})" in line
    assert f"chmod 700 {state}" in line


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o710])
def test_a_private_state_directory_starts_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    assert _start(tmp_path / "state", mode, caplog) == []


def test_a_key_readable_by_others_stays_refused(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    write_private_key(state / "node.key", Ed25519PrivateKey.generate())
    os.chmod(state / "node.key", 0o644)
    assert _start(state, 0o777, caplog)  # the directory: warned and tightened
    with pytest.raises(KeyFileError, match="must be 0600"):
        read_private_key(state / "node.key")  # the key: still refused
