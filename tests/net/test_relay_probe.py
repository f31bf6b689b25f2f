"""py-libp2p 0.8.1 Circuit Relay v2 carries Noise + Yamux end to end (issue 27 item 2)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import trio

_PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "relay_probe.py"


def test_relayed_one_megabyte_echo() -> None:
    spec = importlib.util.spec_from_file_location("relay_probe", _PROBE)
    assert spec is not None
    assert spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    out = trio.run(probe.probe)
    assert out["reserved"] is True
    assert "/p2p-circuit/" in str(out["circuit"])
    assert out["echo_len"] == 1 << 20
    assert out["relayed"] is True
    assert out["b_to_a_conns"] == 1
    assert out["echo_ok"] is True
