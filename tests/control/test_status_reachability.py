"""The reachability block of the typed status (peerd.net.reachability's verdict): it round-trips
through JSON, and `peerd status` prints it on one line."""

from __future__ import annotations

import dataclasses
import json

from peerd.cli.status import reachability_line
from peerd.control.status import ReachabilityStatus, from_json, to_json
from tests.daemon.helpers import sample_status

PUBLIC = ReachabilityStatus(verdict="public", servers=2, reached=2, not_reached=0,
                            checked_s_ago=12.5, last_error=None)


def test_the_reachability_block_round_trips() -> None:
    status = dataclasses.replace(sample_status(), reachability=PUBLIC)
    encoded = to_json(status)
    assert encoded["reachability"] == {"verdict": "public", "servers": 2, "reached": 2,
                                       "not_reached": 0, "checked_s_ago": 12.5,
                                       "last_error": None}
    assert from_json(json.loads(json.dumps(encoded))) == status
    assert to_json(sample_status())["reachability"] is None  # no relays configured


def test_peerd_status_says_what_the_verdict_means() -> None:
    assert reachability_line(PUBLIC) == (
        "reachability: public (no relay reservation needed; 2 of 2 relays dialled us back, "
        "0 could not; checked 12 s ago)")
    unknown = dataclasses.replace(PUBLIC, verdict="unknown", reached=0, checked_s_ago=None)
    assert reachability_line(unknown).startswith(
        "reachability: unknown (relay reservations held; 0 of 2")
    assert reachability_line(unknown).endswith("not checked yet)")
