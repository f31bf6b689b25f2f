"""Discovery across real (namespaced) hosts: separate processes, a bridge, multicast."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peerd.protocol.identity import node_id_of
from tests.net.netns import NetnsHost

NODE = str(Path(__file__).with_name("mdns_node.py"))
#: Whole-scenario bound: start-up (~3 s of imports + mDNS probing) and discovery.
SCENARIO_TIMEOUT_S = 60


def _seed_and_id() -> tuple[str, str]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    seed = os.urandom(32)
    return seed.hex(), node_id_of(Ed25519PrivateKey.from_private_bytes(seed))


def _start(h: NetnsHost, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        h.python(NODE, *args),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )


def _finish(p: subprocess.Popen[str]) -> dict[str, Any]:
    # communicate() also closes stdin, which is what ends a --until-eof node.
    out, err = p.communicate(timeout=SCENARIO_TIMEOUT_S)
    assert p.returncode == 0, err[-3000:]
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    done: dict[str, Any] = events[-1]
    assert done["event"] == "done", out
    done["events"] = events
    return done


def test_two_nodes_find_each_other_and_ignore_another_fleet(
    lan: Callable[[int], list[NetnsHost]],
) -> None:
    h_a, h_b, h_c = lan(3)
    (seed_a, id_a), (seed_b, id_b), (seed_c, id_c) = (_seed_and_id() for _ in range(3))
    procs: list[subprocess.Popen[str]] = []
    try:
        # c (another fleet) first, on all interfaces; it stays until its stdin is closed.
        c = _start(h_c, "--seed", seed_c, "--fleet", "fleet-other", "--until-eof")
        procs.append(c)
        # a stays until b is done (b dials a too); b leaves soon after both exchanges.
        a = _start(h_a, "--seed", seed_a, "--fleet", "fleet-x", "--iface", "eth0",
                   "--expect", "1", "--dial", "--until-eof")
        procs.append(a)
        b = _start(h_b, "--seed", seed_b, "--fleet", "fleet-x", "--iface", "eth0",
                   "--expect", "1", "--dial", "--linger", "0.5")
        procs.append(b)
        rb = _finish(b)
        ra, rc = _finish(a), _finish(c)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    assert ra["found"] == [id_b]
    assert rb["found"] == [id_a]
    peer_b = next(e for e in ra["events"] if e["event"] == "peer")
    assert peer_b["addresses"] == [h_b.address]
    assert peer_b["fleet"] == "fleet-x"
    # The hint led to a connection whose Noise handshake proved the advertised id.
    for r, other in ((ra, id_b), (rb, id_a)):
        ex = [e for e in r["events"] if e["event"] == "exchanged"]
        assert ex == [{"event": "exchanged", "peer": other, "proven": other, "ok": True,
                       "t": ex[0]["t"]}]
    # c was on the wire (and ignored), by a and b alike; c heard both and took neither.
    assert ra["rejected"].get("other_fleet", 0) >= 1
    assert rb["rejected"].get("other_fleet", 0) >= 1
    assert rc["found"] == []
    assert rc["rejected"].get("other_fleet", 0) >= 2
    # Everyone saw its own advertisement come back and dropped it.
    assert all(r["rejected"].get("own_record", 0) >= 1 for r in (ra, rb, rc))
    assert id_c not in ra["found"] + rb["found"]
