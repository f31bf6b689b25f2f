"""The control API's ``audit`` request: typed, validated, answered over the real socket."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from peerd.control.audit import (
    Audit,
    AuditLearner,
    AuditMember,
    AuditRefusal,
    RoundRecord,
    audit_from_json,
    audit_to_json,
    encode_record,
    record_from_json,
    record_to_json,
    request_audit,
)
from peerd.control.server import ControlError, Operations, dispatch
from peerd.control.status import StatusError
from tests.daemon.helpers import running_server, sample_status


def sample_record(round_: int = 4) -> RoundRecord:
    return RoundRecord(
        round=round_, ts=1_800_000_000.5, mode="weights", blend="clipped:1.0",
        members=(AuditMember("12D3KooWself", None, 0.5, 0.9, 0.0, None, None, "accepted"),
                 AuditMember("12D3KooWbad", 3, 0.5, 0.1, 12.0, 41.5, 41.0, "clipped")),
        refused=(AuditRefusal("12D3KooWpeer", "bad_signature", 2),), refused_more=0,
        expired=(), blend_refused=None, published=9)


def test_a_record_round_trips_through_its_json_line() -> None:
    rec = sample_record()
    assert b"\n" not in encode_record(rec)
    assert record_from_json(json.loads(encode_record(rec))) == rec
    audit = Audit(source="daemon", records=(rec,), skipped=1)
    assert audit_from_json(json.loads(json.dumps(audit_to_json(audit)))) == audit


def test_a_record_of_another_shape_names_its_problems() -> None:
    obj: dict[str, Any] = json.loads(encode_record(sample_record()))
    obj["members"][1]["alpha"] = "high"
    del obj["round"]
    with pytest.raises(StatusError, match=r"round: missing.*members\[1\]\.alpha"):
        record_from_json(obj)


def _ops(seen: list[int | None]) -> Operations:
    def audit(since: int | None) -> dict[str, Any]:
        seen.append(since)
        records = tuple(r for r in (sample_record(3), sample_record(5))
                        if since is None or r.round >= since)
        return audit_to_json(Audit(source="daemon", records=records, skipped=0))

    return Operations(sample_status, audit=audit)


def test_dispatch_passes_since_and_refuses_a_bad_one() -> None:
    seen: list[int | None] = []
    ok = dispatch(b'{"api": 1, "method": "audit", "since": 4}', _ops(seen))
    assert ok["ok"] is True
    assert seen == [4]
    assert [r["round"] for r in ok["result"]["records"]] == [5]
    for bad in (b'"x"', b"-1", b"true", b"1.5"):
        answer = dispatch(b'{"api": 1, "method": "audit", "since": ' + bad + b"}", _ops(seen))
        assert answer["error"]["code"] == "bad_request"
    assert seen == [4]
    plain = dispatch(b'{"api": 1, "method": "audit"}', sample_status)  # no audit offered
    assert plain["error"]["code"] == "unknown_method"


def test_live_request_over_the_socket(tmp_path: Path) -> None:
    path = tmp_path / "peerd.sock"
    seen: list[int | None] = []
    with running_server(path, _ops(seen)):
        everything = request_audit(path)
        recent = request_audit(path, since=5)
    assert seen == [None, 5]
    assert everything.source == "daemon"
    assert everything.records == (sample_record(3), sample_record(5))
    assert recent.records == (sample_record(5),)
    refusal = everything.records[0].refused[0]
    assert (refusal.peer, refusal.reason, refusal.count) == ("12D3KooWpeer", "bad_signature", 2)


def test_a_daemon_without_the_audit_says_so(tmp_path: Path) -> None:
    path = tmp_path / "peerd.sock"
    with running_server(path), pytest.raises(ControlError) as err:
        request_audit(path)
    assert err.value.code == "unknown_method"


def test_a_record_written_before_withdrawn_existed_still_reads() -> None:
    # Issue 24 added "withdrawn"; a round log from before must not be skipped as corrupt.
    old = record_to_json(sample_record())
    del old["withdrawn"]
    assert record_from_json(old) == sample_record()
    assert record_from_json(old).withdrawn == ()


def test_a_learner_round_round_trips_and_an_older_record_reads_without_one() -> None:
    # Issue 26 item 8: a learner's fit and evaluation metrics (or its refusal) in the record.
    rec = dataclasses.replace(sample_record(), learner=AuditLearner(
        fit_metrics={"train_loss": 0.25, "lr": 1e-3}, eval_metrics={"accuracy": 0.875},
        failure=None, detail=None))
    assert record_from_json(json.loads(encode_record(rec))) == rec
    refused = dataclasses.replace(rec, learner=AuditLearner(
        fit_metrics={}, eval_metrics={}, failure="non_finite", detail="w: holds NaN"))
    assert record_from_json(json.loads(encode_record(refused))).learner == refused.learner
    old = record_to_json(rec)
    del old["learner"], old["withdrawn"]  # a line written before issues 24 and 26
    assert record_from_json(old) == sample_record()
    assert record_from_json(old).learner is None
    bad = record_to_json(rec)
    bad["learner"]["fit_metrics"]["lr"] = "fast"
    with pytest.raises(StatusError, match=r"learner\.fit_metrics\.lr"):
        record_from_json(bad)
