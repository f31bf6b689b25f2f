"""One bootstrap address is enough (issue 27, item 1): three daemons on loopback, mDNS off,
no static peers. A and C each know only B (``[network] bootstrap = [B]``); B knows nobody.
Through the address exchange A and C learn each other's signed records from B, dial each
other and swap entries directly; after a restart C's address book still names A."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.mesh import (
    STARTUP_TIMEOUT_S,
    Node,
    make_fleet,
    start,
    status,
    wait_for,
    write_overrides,
)


def _peer(node: Node, peer_id: str) -> dict[str, Any] | None:
    return next((p for p in status(node)["peers"] if p["id"] == peer_id), None)


def _direct(node: Node, origin: str) -> bool:
    """``node`` holds an entry of ``origin`` that ``origin`` itself handed it (False while
    ``node`` does not answer yet: start-up imports take a while)."""
    s = node.status()
    return s is not None and any(c["origin"] == origin and c["received_from"] == origin
                                 for c in s["cache"])


def test_one_bootstrap_address_is_enough_to_meet_the_rest_of_the_fleet(
        tmp_path: Path, running: list[Node]) -> None:
    a, b, c = make_fleet(tmp_path, 3, base_port=27750, learning={"local_steps": 2})
    for node, known in ((a, [b]), (b, []), (c, [b])):
        write_overrides(node.config, network={
            "static_peers": [], "bootstrap": [o.multiaddr() for o in known]})
    start((b, a, c), running)

    def a_and_c_met() -> bool:
        return _direct(a, c.id) and _direct(c, a.id)

    wait_for(a_and_c_met, STARTUP_TIMEOUT_S + 60,
             "a and c to swap entries directly, knowing only b", [a, b, c])
    # Each learned where the other lives from a signed record, not from the config.
    for me, other in ((a, c), (c, a)):
        peer = _peer(me, other.id)
        assert peer is not None
        assert peer["source"] == "exchanged", peer
        assert peer["addrs"] == [f"/ip4/127.0.0.1/tcp/{other.port}"]
    assert _peer(a, b.id)["source"] == "bootstrap"  # type: ignore[index]

    # The book is on disk: restarted with B gone, C restores A's record (verified again) and
    # syncs with A.
    b.stop()
    c.stop()
    assert (c.dir / "blobs" / "addrbook").exists()
    c.start()
    wait_for(lambda: c.status() is not None and (_peer(c, a.id) or {}).get("sessions", 0) > 0,
             STARTUP_TIMEOUT_S + 30, "c, restarted without b, to sync with a", [a, c])
    restored = [line for line in c.logs().splitlines() if "address book:" in line]
    assert restored[-1].endswith("2 members' addresses restored"), restored
    assert _peer(c, a.id)["source"] == "exchanged"  # type: ignore[index]
