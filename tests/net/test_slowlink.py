"""A transfer cut on a real libp2p connection across the namespace WAN resumes with only the
rest (issue 27, item 5): two peerd transports, the sender behind site a's NAT router, the
receiver on the public segment, site a's uplink at 20 Mbit/s with 1 % loss each way
(tests/net/wan.py: tbf and an iptables statistic DROP; no netem needed). Once the receiver
holds 40 % of the entry, the uplink carries nothing for 8 s: both ends' kernels give up on the
connection (the sender's unacknowledged data, the receiver's unanswered keepalives; mend 9
closes them), the receiver keeps what it spooled, and the sender's next dial is a new
connection and a new session, which asks for the entry from the byte it stopped at
(resume/v1). The in-process tests of the same protocol are tests/net/test_gossip_resume.py.

Slow: two processes that import torch, the WAN, the transfer and an 8 s cut are about 40 s
on a loaded 2-core machine (the transfer itself about 11 s)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.net.slowlink import run
from tests.net.wan import Link, skip_reason, wan

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LINK = Link(rate_mbit=20.0, loss_pct=1.0)
#: Headroom over the entry's tail in the resumed session: its Hello, manifest digest,
#: Digest and Want frames and the tail's entry head (a few kB).
SESSION_OVERHEAD = 64 * 1024


def test_a_transfer_cut_on_the_uplink_resumes_with_only_the_rest(tmp_path: Path) -> None:
    reason = skip_reason(LINK)
    if reason is not None:
        pytest.skip(reason)
    with wan((1, 1), 1, link=LINK) as w:
        got = run(w, tmp_path, mb=4.0, cut_at=0.4, cut_s=8.0)
    entry, last = got.entry_bytes, got.last
    print(f"{entry} B entry, cut at {got.cut_at_bytes} B spooled: sessions at the receiver "
          f"{[(s['bytes_in'], s['error'] is None) for s in got.receiver]}, "
          f"{got.bytes_in} B in all, {got.wall_s:.1f} s", file=sys.stderr)
    assert got.cut_at_bytes is not None
    assert got.cut_at_bytes >= 0.4 * entry
    # The cut killed the first session (a new connection, not TCP riding it out)...
    assert got.receiver[0]["error"] is not None
    assert got.receiver[0]["received"] == 0
    # ...and a later one cached the entry, resumed from what the cut session had spooled.
    assert last["received"] == 1
    assert last["error"] is None
    assert last["resumed"] == 1
    kept = last["bytes_not_resent"]
    assert kept >= 0.35 * entry  # (the spool file's size counts its 32-byte header too)
    # Re-sent after the cut: the rest, not the whole entry.
    assert last["bytes_in"] <= entry - kept + SESSION_OVERHEAD
    assert got.bytes_in < entry + 2 * SESSION_OVERHEAD
