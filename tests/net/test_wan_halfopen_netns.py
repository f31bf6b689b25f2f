"""An idle connection across a NAT that forgot its mapping ends soon after its peer closes
it (mend 9's keepalive, peerd.net.transport_config): the NAT rebinding outliers of
docs/reliability.md. The public end closes after the site router's ``conntrack -F``; its FIN
(and RST) cannot reach the site host, which sends nothing, as a gossip responder waiting for
its peer's next frame. Only the site host's first keepalive probe re-creates a mapping and
draws the answer that ends the connection; at the old 15 s idle, a session held its peer
that long (measured 15-16 s)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from peerd.net.transport_config import (
    STALLED_PROBES,
    TCP_KEEPALIVE_IDLE_S,
    TCP_KEEPALIVE_INTERVAL_S,
)
from tests.net.wan import wan_or_skip

SCRIPT = str(Path(__file__).with_name("wan_halfopen.py"))
PORT = 7011  # inside the namespaces only
#: The bound asserted: the keepalive idle plus the silent path's probes, with slack for a
#: loaded machine; 15 s (the old idle) would exceed it.
BOUND_S = TCP_KEEPALIVE_IDLE_S + STALLED_PROBES * TCP_KEEPALIVE_INTERVAL_S + 4.0


def _line(p: subprocess.Popen[str]) -> str:
    assert p.stdout is not None
    return p.stdout.readline().strip()


def _say(p: subprocess.Popen[str], line: str) -> None:
    assert p.stdin is not None
    p.stdin.write(line + "\n")
    p.stdin.flush()


@pytest.mark.parametrize("site_name", ["a", "b"])
def test_an_idle_connection_ends_soon_after_the_nat_forgets_it_and_the_peer_closes(
        site_name: str) -> None:
    assert BOUND_S < 15.0
    with wan_or_skip((1, 1), 1) as w:
        site, pub = w.sites[site_name], w.public[0]
        procs: list[subprocess.Popen[str]] = []
        try:
            holder = subprocess.Popen(pub.python(SCRIPT, "hold", str(PORT)), text=True,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            procs.append(holder)
            assert _line(holder) == "listening"
            waiter = subprocess.Popen(site.hosts[0].python(SCRIPT, "wait", pub.address,
                                                           str(PORT)), text=True,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            procs.append(waiter)
            assert _line(waiter) == "ready"
            assert _line(holder) == "accepted"
            subprocess.run(site.router.command(["conntrack", "-F"]), check=True,
                           capture_output=True, timeout=10)
            _say(waiter, "t0")
            _say(holder, "close")
            assert _line(holder) == "closed"
            t0 = time.monotonic()
            how, seconds = _line(waiter).split()
            waited = time.monotonic() - t0
        finally:
            for p in procs:
                p.kill()
                p.wait()
    print(f"site {site_name}: the idle end saw {how} {seconds} s after the close",
          file=sys.stderr)
    assert how in ("eof", "reset"), how
    assert waited < BOUND_S, (how, seconds)
