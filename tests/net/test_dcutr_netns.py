"""DCUtR across the namespace WAN (benchmarks/dcutr_probe.py; issue 27 item 3): what py-libp2p
0.8.1's hole punching does between hosts behind NAT routers, reached first through a
Circuit Relay v2 hop on the public segment.

Both sites endpoint-independent, the routers dropping unsolicited inbound SYNs (as home
routers do): the DCUtR exchange runs over the relayed connection and a TCP simultaneous open
from both listen ports gives each side a direct connection to the other router's public
address. With site b symmetric (``--random-fully``) the predicted port is wrong and the peers
stay relayed, as NAT theory says they must."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.net.wan import skip_reason

pytestmark = pytest.mark.slow

_PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "dcutr_probe.py"


def _probe(case: str, wait_s: float) -> dict[str, Any]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    spec = importlib.util.spec_from_file_location("dcutr_probe", _PROBE)
    assert spec is not None
    assert spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    out: dict[str, Any] = probe.probe(case, wait_s, routers_drop=True)
    return out


def test_hole_punch_between_two_endpoint_independent_sites() -> None:
    out = _probe("site-b-eim", 20.0)
    a, b = out["listener"], out["dialer"]
    assert a["reserved"] is True
    # Relayed first: the dialer knew nothing of A but the circuit through R.
    [relayed] = b["after_dial"]
    assert "/p2p-circuit/" in relayed
    assert a["initiate_result"] is True, a["dcutr_log"]
    # Each ends with a direct connection to the other site's router, on the listen port.
    assert "/ip4/203.0.113.3/tcp/4001" in a["connections"], a
    assert "/ip4/203.0.113.2/tcp/4001" in b["connections"], b
    assert (a["path"], b["path"]) == ("direct", "direct")
    # With the plain library's record read (peerd/net/holepunch.py): hole-punched on the
    # side that initiated. The dialer's side may read "direct": py-libp2p drops a peer from
    # its ``_direct_connections`` when *any* of its connections closes (the relayed leg
    # too), the defect peerd's own service (peerd/net/dcutr.py) records around; its label
    # is held by tests/integration/test_wan_holepunch.py. The connections above already
    # show the punch.
    assert a["path_with_dcutr"] == "hole-punched", a
    assert b["path_with_dcutr"] in ("hole-punched", "direct"), b
    assert isinstance(b["ping_ms"], float)
    assert b["ping_ms"] > 0.0


def test_a_symmetric_site_stays_relayed() -> None:
    out = _probe("site-b", 8.0)
    a, b = out["listener"], out["dialer"]
    assert a["initiate_result"] is not True
    assert (a["path"], b["path"]) == ("relayed", "relayed")
    assert (a["path_with_dcutr"], b["path_with_dcutr"]) == ("relayed", "relayed")
    assert a["relay"] == b["relay"]
    assert a["relay"] is not None
