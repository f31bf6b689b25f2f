"""The typed status and its JSON codec: round trips, recorded daemon output, shape errors,
and the documented shape (docs/operations.md) held equal to the schema."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from peerd.control.server import dispatch
from peerd.control.status import (
    CacheRow,
    ConfigStatus,
    LearnerStatus,
    NodeStatus,
    OfflineCacheRow,
    OfflineNode,
    OfflineStatus,
    PeerRow,
    Status,
    StatusError,
    TrackingStatus,
    ViewsStatus,
    finite,
    from_json,
    peers_from_json,
    peers_to_json,
    to_json,
)
from tests.daemon.helpers import sample_status

FIXTURES = Path(__file__).parent / "fixtures"
#: Control-socket answers recorded from real `peerd run` daemons (two on loopback, digits) by
#: the code before the status was typed (tests/control/record_status.py): one before the
#: first round ended (nulls, no peer connected yet), one after the two had swapped entries.
RECORDED = sorted(FIXTURES.glob("status-*.jsonl"))
DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def names(cls: type[Any]) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def test_round_trip_keeps_every_value() -> None:
    status = sample_status()
    encoded = to_json(status)
    assert from_json(json.loads(json.dumps(encoded))) == status
    assert list(encoded) == names(Status)
    assert list(encoded["node"]) == names(NodeStatus)
    assert list(encoded["cache"][0]) == names(CacheRow)
    assert peers_from_json(peers_to_json(status.peers)) == status.peers


def test_recorded_fixtures_exist() -> None:
    assert [p.name for p in RECORDED] == ["status-running.jsonl", "status-starting.jsonl"]


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_a_recorded_daemon_answer_decodes_and_encodes_to_the_same_bytes(path: Path) -> None:
    line = path.read_bytes()
    status = from_json(json.loads(line)["result"])
    # The very bytes the control server sends for it, envelope and newline included.
    response = dispatch(b'{"api": 1, "method": "status"}', lambda: status)
    assert json.dumps(response).encode() + b"\n" == line
    peers = dispatch(b'{"api": 1, "method": "peers"}', lambda: status)
    assert peers["result"] == {"peers": json.loads(line)["result"]["peers"]}


def test_the_recorded_answers_show_both_sides_of_nullable_fields() -> None:
    # What the fixtures are for: nulls before the first round, numbers after an exchange.
    starting, running = (from_json(json.loads(p.read_bytes())["result"])
                         for p in sorted(RECORDED, reverse=True))
    assert starting.node.train_loss is None
    assert starting.node.published_version is None
    assert not starting.cache
    assert not any(p.connected for p in starting.peers)
    assert running.node.train_loss is not None
    assert running.node.published_version is not None
    assert running.cache[0].verified
    assert running.cache[0].alpha is not None
    assert running.peers[0].connected
    assert running.peers[0].source == "static"


def test_nan_and_infinity_become_null() -> None:
    status = sample_status()
    status = dataclasses.replace(
        status,
        node=dataclasses.replace(status.node, train_loss=math.nan, val_accuracy=math.inf),
        cache=(dataclasses.replace(status.cache[0], alpha=-math.inf, drift=math.nan),))
    encoded = to_json(status)
    assert encoded["node"]["train_loss"] is None
    assert encoded["node"]["val_accuracy"] is None
    assert encoded["cache"][0]["alpha"] is None
    assert encoded["cache"][0]["drift"] is None
    text = json.dumps(encoded, allow_nan=False)  # valid JSON: no NaN/Infinity spelled out
    assert from_json(json.loads(text)).node.train_loss is None
    assert finite(math.nan) is None
    assert finite(None) is None
    assert finite(2.5) == 2.5


def test_numbers_keep_their_json_form() -> None:
    # An integral number where a float is declared stays an integer: re-encoding a document
    # gives back its bytes, whichever way the sender spelled the number.
    doc = to_json(sample_status())
    doc["cache"][0]["created_at"] = 1_800_000_000
    assert json.dumps(to_json(from_json(doc))) == json.dumps(doc)


def test_unknown_keys_are_ignored() -> None:
    # The documented contract: a later release may add keys; this one reads what it knows.
    doc = to_json(sample_status())
    doc["node"]["future"] = {"anything": [1]}
    doc["future"] = 1
    assert from_json(doc) == sample_status()


@pytest.mark.parametrize(("change", "problem"), [
    (lambda d: d["node"].pop("val_accuracy"), "node.val_accuracy: missing"),
    (lambda d: d.pop("config"), "config: missing"),
    (lambda d: d["cache"][0].pop("verified"), "cache[0].verified: missing"),
    (lambda d: d.update(peers={}), "peers: expected a list, got an object"),
    (lambda d: d["node"].update(round=True), "node.round: expected an integer, got a boolean"),
    (lambda d: d["node"].update(round=3.0), "node.round: expected an integer, got a number"),
    (lambda d: d["node"].update(train_loss="0.4"),
     "node.train_loss: expected a number, got a string"),
    (lambda d: d["cache"][0].update(verified=1),
     "cache[0].verified: expected a boolean, got a number"),
    (lambda d: d["peers"][0].update(source="carrier-pigeon"),
     "peers[0].source: expected 'mdns' or 'static' or 'bootstrap' or 'exchanged' or "
     "'inbound', got a string"),
    (lambda d: d["config"].update(staleness=None),
     "config.staleness: expected 'time' or 'rounds', got null"),
    (lambda d: d["peers"][0].update(addrs=["/ip4/10.0.0.2", 4011]),
     "peers[0].addrs[1]: expected a string, got a number"),
    (lambda d: d["rejected"].update(stale="1"),
     "rejected.stale: expected an integer, got a string"),
    (lambda d: d.update(flagged=None), "flagged: expected a list, got null"),
    (lambda d: d.update(node=[]), "node: expected an object, got a list"),
])
def test_a_wrong_shape_is_refused_naming_the_key(change: Any, problem: str) -> None:
    doc = to_json(sample_status())
    change(doc)
    with pytest.raises(StatusError) as err:
        from_json(doc)
    assert err.value.problems == [problem]
    assert str(err.value) == f"malformed status: {problem}"


def test_every_problem_is_listed_at_once() -> None:
    doc = to_json(sample_status())
    del doc["node"]["val_accuracy"]
    del doc["cache"][0]["verified"]
    doc["peers"] = {}
    with pytest.raises(StatusError) as err:
        from_json(doc)
    assert err.value.problems == ["node.val_accuracy: missing", "cache[0].verified: missing",
                                  "peers: expected a list, got an object"]
    not_objects: list[Any] = [[], "status", None]
    for not_an_object in not_objects:
        with pytest.raises(StatusError, match="status: expected an object"):
            from_json(not_an_object)
    with pytest.raises(StatusError, match="peers"):
        peers_from_json({"peers": None})
    with pytest.raises(StatusError, match=r"peers\[0\].id: expected a string"):
        peers_from_json({"peers": [{**peers_to_json(sample_status().peers)["peers"][0],
                                    "id": 7}]})


def test_a_status_is_frozen() -> None:
    status = sample_status()
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.node.round = 4  # type: ignore[misc]
    assert hash(status.peers) == hash(sample_status().peers)


def test_offline_status_encodes_in_its_documented_order() -> None:
    offline = OfflineStatus(
        running=False, state_dir="/var/lib/peerd",
        node=OfflineNode(id=None, round=2, version=1, counters_lost=False),
        cache=(OfflineCacheRow(origin="12D3KooWpeer", version=None, received_from=None,
                               received_at=1.5, blob="entry-12D3KooWpeer", bytes=10),))
    assert json.dumps(to_json(offline)) == (
        '{"running": false, "state_dir": "/var/lib/peerd", "node": {"id": null, "round": 2, '
        '"version": 1, "counters_lost": false}, "cache": [{"origin": "12D3KooWpeer", '
        '"version": null, "received_from": null, "received_at": 1.5, '
        '"blob": "entry-12D3KooWpeer", "bytes": 10}]}')


# ---------------------------------------------------------------------------- the docs


def documented_shape() -> dict[str, Any]:
    """The status block of docs/operations.md, parsed: ``{"a", "b"}`` (a set of key names in
    the doc) becomes a list in order, ``count`` a number."""
    text = DOCS.read_text()
    start = text.index("`peerd status --json` prints exactly")
    block = text[text.index("```", start) + 3:]
    block = block[:block.index("```")]
    as_lists = re.sub(r'\{(\s*"[^"]*"(?:,\s*"[^"]*")*\s*)\}', r"[\1]", block)
    shape: dict[str, Any] = ast.literal_eval(as_lists.replace("count", "0").strip())
    return shape


def test_the_documented_shape_is_the_schema() -> None:
    shape = documented_shape()
    assert list(shape) == names(Status)
    assert shape["node"] == names(NodeStatus)
    assert shape["config"] == names(ConfigStatus)
    assert shape["cache"] == [names(CacheRow)]
    assert shape["peers"] == [names(PeerRow)]
    assert shape["accepted"] == 0
    assert shape["rejected"] == shape["dropped"] == {"<reason>": 0}
    assert shape["flagged"] == ["<origin>"]
    assert shape["views"] == names(ViewsStatus)
    assert shape["learner"] == names(LearnerStatus)
    assert shape["tracking"] == names(TrackingStatus)


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_every_documented_key_is_in_a_recorded_status(path: Path) -> None:
    result = json.loads(path.read_bytes())["result"]
    shape = documented_shape()
    assert list(result) == list(shape)
    for section in ("node", "config"):
        assert list(result[section]) == shape[section]
    for section in ("cache", "peers"):
        for row in result[section]:
            assert list(row) == shape[section][0]
