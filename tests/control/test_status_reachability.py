"""The reachability block of the typed status (peerd.net.reachability's verdict): it round-trips
through JSON, and `peerd status` prints it on one line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from peerd.cli.status import reachability_line
from peerd.control.status import (
    ReachabilityStatus,
    RelayRow,
    StatusError,
    from_json,
    to_json,
)
from tests.daemon.helpers import sample_status

RELAY = "/ip4/203.0.113.10/tcp/4011/p2p/12D3KooWDth3Y6EhR6M8CnCL966Yt9TM9HMYYbZHftu6DixgdNiB"
PUBLIC = ReachabilityStatus(verdict="public", servers=2, reached=2, not_reached=0,
                            checked_s_ago=12.5, last_error=None,
                            relays=(RelayRow(addr=RELAY, source="learned",
                                             reserved_until=None, failures=1,
                                             last_error="timed out"),))


def test_the_reachability_block_round_trips() -> None:
    status = dataclasses.replace(sample_status(), reachability=PUBLIC)
    encoded = to_json(status)
    assert encoded["reachability"] == {"verdict": "public", "servers": 2, "reached": 2,
                                       "not_reached": 0, "checked_s_ago": 12.5,
                                       "last_error": None,
                                       "relays": [{"addr": RELAY, "source": "learned",
                                                   "reserved_until": None, "failures": 1,
                                                   "last_error": "timed out"}]}
    assert from_json(json.loads(json.dumps(encoded))) == status
    assert to_json(sample_status())["reachability"] is None  # no relays configured


def test_peerd_status_says_what_the_verdict_means() -> None:
    assert reachability_line(PUBLIC) == (
        "reachability: public (no relay reservation needed, 1 learned relay; 2 of 2 relays "
        "dialled us back, "
        "0 could not; checked 12 s ago)")
    unknown = dataclasses.replace(PUBLIC, verdict="unknown", reached=0, checked_s_ago=None)
    assert reachability_line(unknown).startswith(
        "reachability: unknown (relay reservations held, 1 learned relay; 0 of 2")
    assert reachability_line(unknown).endswith("not checked yet)")


def test_a_source_other_than_configured_or_learned_does_not_decode() -> None:
    encoded = to_json(dataclasses.replace(sample_status(), reachability=PUBLIC))
    encoded["reachability"]["relays"][0]["source"] = "gossiped"
    with pytest.raises(StatusError, match="source"):
        from_json(json.loads(json.dumps(encoded)))


def test_a_relay_client_with_no_relay_yet_says_so() -> None:
    idle = dataclasses.replace(PUBLIC, verdict="unknown", servers=0, reached=0, relays=())
    assert reachability_line(idle) == \
        "reachability: not checked (no relay configured or learned yet)"
