"""Reachability in the test WAN, the short form (issue 27 item 3; the daemons' form is
tests/integration/test_wan_reachability.py): a ``peerd relay`` on the public segment, and one
check (tests/net/reach_probe.py) from a host on the public segment and one from a host behind
site a's NAT router. The first is judged ``public``, the second ``private``.

The second is what a dial-back on the request's own connection cannot give (py-libp2p's
``AutoNATService`` dials with ``host.connect``, which returns the open connection): through
that connection every asker is reached, so the NAT'd host would be judged public."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peerd.mesh.netns import Host
from tests.integration.relay_sites import start_relay, stop_relay
from tests.net.wan import Wan, wan_or_skip

PROBE_PORT = 4001
PROBE_TIMEOUT_S = 60


@pytest.fixture
def net() -> Iterator[Wan]:
    with wan_or_skip((1, 0), 2, net=81) as w:
        yield w


def _probe(host: Host, relay: str) -> dict[str, Any]:
    done = subprocess.run(host.python("-m", "tests.net.reach_probe", relay, str(PROBE_PORT)),
                          capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert done.returncode == 0, done.stderr[-2000:]
    assert lines, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def test_a_public_host_is_public_and_one_behind_a_nat_private(tmp_path: Path,
                                                                net: Wan) -> None:
    proc, relay = start_relay(net.public[0], tmp_path / "relay")
    try:
        public = _probe(net.public[1], relay)
        natd = _probe(net.sites["a"].hosts[0], relay)
    finally:
        stop_relay(proc)
    assert public == {"verdict": "public", "reached": 1, "not_reached": 0, "error": None}
    assert natd == {"verdict": "private", "reached": 0, "not_reached": 1, "error": None}
