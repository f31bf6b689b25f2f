"""`peerd peers`' path and rtt columns, the rows' JSON, and `peerd status`' count of paths
(issue 27 item 3)."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from peerd.cli.peers import path_text, render_peers, rtt_text
from peerd.cli.status import status_view
from peerd.control.status import PeerRow, peers_from_json, peers_to_json
from tests.daemon.helpers import sample_status

RELAY = "12D3KooWQoZCTWQKSDb8R8dJ1ybPTB6BniCktUTQRyNPvEweoHW9"
BASE = PeerRow(id="12D3KooWNdD52pNh91zJwXAuLRMsaAwotPwR3zv5UUKeyPfxSZRF", addrs=(),
               connected=True, last_seen=100.0, bytes_in=1, bytes_out=2, budget_refusals=0,
               source="static", sessions=1, last_error=None, failures=0, retry_in_s=None)


def test_columns() -> None:
    rows = (dataclasses.replace(BASE, path="lan", rtt_ms=0.4213, rtt_last_ms=0.5),
            dataclasses.replace(BASE, id="12D3KooWb", path="relayed", relay=RELAY,
                                rtt_ms=41.7, rtt_last_ms=40.0),
            dataclasses.replace(BASE, id="12D3KooWc", path="direct", rtt_ms=3.14159),
            dataclasses.replace(BASE, id="12D3KooWd", connected=False))
    assert [path_text(r) for r in rows] == ["lan", "relayed via 12D3Ko…weoHW9", "direct", "-"]
    assert [rtt_text(r) for r in rows] == ["0.42 ms", "42 ms", "3.1 ms", "-"]
    assert path_text(dataclasses.replace(BASE, path="relayed")) == "relayed"  # relay unknown
    console = Console(width=250, record=True)
    render_peers(console, rows, now=110.0)
    text = console.export_text()
    for want in ("path", "rtt", "relayed via 12D3Ko…weoHW9", "0.42 ms", "42 ms"):
        assert want in text


def test_json_round_trip() -> None:
    row = dataclasses.replace(BASE, path="relayed", relay=RELAY, rtt_ms=12.5, rtt_last_ms=11.0)
    encoded = peers_to_json((row, BASE))
    assert {k: encoded["peers"][0][k] for k in ("path", "relay", "rtt_ms", "rtt_last_ms")} == \
        {"path": "relayed", "relay": RELAY, "rtt_ms": 12.5, "rtt_last_ms": 11.0}
    assert {k: encoded["peers"][1][k] for k in ("path", "relay", "rtt_ms", "rtt_last_ms")} == \
        dict.fromkeys(("path", "relay", "rtt_ms", "rtt_last_ms"))
    assert peers_from_json(encoded) == (row, BASE)


def test_status_summary_counts_paths() -> None:
    base = sample_status()
    (row,) = base.peers
    rows = (dataclasses.replace(row, path="lan"),
            dataclasses.replace(row, id="12D3KooWb", path="relayed", relay=RELAY),
            dataclasses.replace(row, id="12D3KooWc", path="lan"),
            dataclasses.replace(row, id="12D3KooWd", connected=False))
    console = Console(width=200, record=True)
    console.print(status_view(dataclasses.replace(base, peers=rows)))
    assert "peers: 3 connected, 4 known; lan 2, relayed 1 (`peerd peers`" in console.export_text()
    console = Console(width=200, record=True)
    console.print(status_view(base))  # no path known: the line as before
    assert "peers: 1 connected, 1 known (`peerd peers`" in console.export_text()
