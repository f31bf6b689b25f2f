"""The systemd unit: `systemd-analyze verify` accepts it, and it keeps the promised settings."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "peerd.service"
#: systemd-analyze starts in well under a second; a hang must not stall the suite.
ANALYZE_TIMEOUT_S = 60


def settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_unit_promises() -> None:
    s = settings()
    expect = {
        "Type": "notify", "Restart": "on-failure", "StateDirectory": "peerd",
        "StateDirectoryMode": "0700", "RuntimeDirectory": "peerd",
        "ConfigurationDirectory": "peerd", "User": "peerd", "NoNewPrivileges": "yes",
        "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "KillSignal": "SIGTERM",
    }
    for key, value in expect.items():
        assert s.get(key) == [value], key
    assert s["ExecStart"] == ["/usr/local/bin/peerd run --config /etc/peerd/peerd.toml"]
    assert "TimeoutStopSec" in s
    # torch generates code at run time: this protection would crash it.
    assert "MemoryDenyWriteExecute" not in s


def verifiable_copy(tmp_path: Path) -> Path:
    # `verify` insists that ExecStart's binary exists; the test machine has no
    # /usr/local/bin/peerd, so point it at a binary that does (nothing else changes).
    unit = tmp_path / "peerd.service"
    unit.write_text(UNIT.read_text().replace("ExecStart=/usr/local/bin/peerd ",
                                             "ExecStart=/bin/true "))
    return unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed (Debian package: systemd)")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(verifiable_copy(tmp_path))],
                          capture_output=True, text=True, timeout=ANALYZE_TIMEOUT_S, check=False)
    # verify exits 0 even for unknown keys or bad values ("... ignoring"): its stderr is the
    # real verdict, so any output at all fails the test.
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    assert done.stdout == "", done.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed (Debian package: systemd)")
def test_systemd_analyze_catches_a_typo(tmp_path: Path) -> None:
    # The check above can fail: a misspelt key is reported.
    unit = verifiable_copy(tmp_path)
    unit.write_text(unit.read_text().replace("ProtectHome=yes", "ProtectHomes=yes"))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                          capture_output=True, text=True, timeout=ANALYZE_TIMEOUT_S, check=False)
    assert "ProtectHomes" in done.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed (Debian package: systemd)")
def test_exposure_level_is_ok(tmp_path: Path) -> None:
    # --threshold is on systemd's internal 0-100 scale: 50 means "5.0 OK" or better.
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=50",
                           "--no-pager", str(verifiable_copy(tmp_path))],
                          capture_output=True, text=True, timeout=ANALYZE_TIMEOUT_S, check=False)
    if "--offline" in done.stderr and "unrecognized" in done.stderr:
        pytest.skip("systemd-analyze too old for offline security review (needs >= 250)")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
