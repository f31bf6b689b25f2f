"""The daemon's participation audit: one record per round from the round's own numbers."""

from __future__ import annotations

import json
from pathlib import Path

from peerd.control.audit import RoundRecord, audit_from_json, record_from_json
from peerd.core.entry import CacheItem, EntryMeta
from peerd.core.modes import ModeName
from peerd.core.staleness import Clock
from peerd.core.updatenorm import Verdict
from peerd.daemon.participation import MAX_REFUSAL_ROWS, Participation
from peerd.learn.trainer import RoundOutput
from peerd.store.roundlog import read_round_log

OWN, GOOD, BAD = "12D3KooWown", "12D3KooWgood", "12D3KooWbad"


def _item(origin: str, version: int, created_at: float) -> CacheItem:
    return CacheItem(EntryMeta(origin, version, created_at, "s", 10, "d"), "relay", created_at)


def _out(**kw: object) -> RoundOutput:
    base: dict[str, object] = dict(params={}, alpha={OWN: 0.5, GOOD: 0.25, BAD: 0.25},
                                   examples=10, train_loss=0.1, val_loss=0.2,
                                   val_accuracy=0.9, moved=1.0, publish=True)
    return RoundOutput(**{**base, **kw})  # type: ignore[arg-type]


def _record(p: Participation, out: RoundOutput, round_no: int = 7) -> RoundRecord:
    return p.weights_round(round_no=round_no, out=out, own_id=OWN,
                           cache=(_item(GOOD, 4, 990.0), _item(BAD, 9, 900.0)),
                           clock=Clock.time(1000.0), drift={GOOD: 0.5, BAD: 40.0},
                           published=12)


def test_a_clipped_round_records_the_weights_used_staleness_and_drift(tmp_path: Path) -> None:
    p = Participation(tmp_path, "clipped:1.0", clock=lambda: 1234.5)
    rec = _record(p, _out(weights={OWN: 0.74, GOOD: 0.25, BAD: 0.01}))
    assert [m.origin for m in rec.members] == [OWN, GOOD, BAD]
    own, good, bad = rec.members
    assert (own.version, own.alpha, own.weight, own.staleness, own.drift) == (
        None, 0.5, 0.74, 0.0, None)
    assert (good.version, good.alpha, good.weight, good.staleness, good.drift) == (
        4, 0.25, 0.25, 10.0, 0.5)
    assert (bad.alpha, bad.weight, bad.staleness, bad.drift) == (0.25, 0.01, 100.0, 40.0)
    assert (rec.round, rec.ts, rec.blend, rec.published) == (7, 1234.5, "clipped:1.0", 12)
    # On disk, one checksummed line that decodes back to the same record.
    (line,) = read_round_log(tmp_path).records
    assert line.round == 7
    assert record_from_json(json.loads(line.body)) == rec


def test_without_changed_weights_the_plan_alpha_is_the_weight(tmp_path: Path) -> None:
    rec = _record(Participation(tmp_path, "weighted"), _out())
    assert [m.weight for m in rec.members] == [0.5, 0.25, 0.25]
    median = _record(Participation(tmp_path / "m", "median"), _out())
    assert [m.weight for m in median.members] == [None, None, None]  # per coordinate


def test_refusals_between_rounds_and_a_rejected_update_are_in_the_next_record(
        tmp_path: Path) -> None:
    p = Participation(tmp_path, "weighted")
    p.refused("12D3KooWpeer", "bad_signature", 2)
    p.refused("12D3KooWpeer", "bad_signature")
    p.expired("12D3KooWold", 3)
    rec = _record(p, _out(norm_verdicts={BAD: Verdict.REJECTED}, update_norms={GOOD: 1.0,
                                                                                  BAD: 99.0},
                          weights={OWN: 2 / 3, GOOD: 1 / 3, BAD: 0.0}))
    assert {(r.peer, r.reason, r.count) for r in rec.refused} == {
        ("12D3KooWpeer", "bad_signature", 3), (BAD, "update_norm_too_large", 1)}
    assert rec.members[2].verdict == "rejected"
    assert rec.members[2].weight == 0.0
    assert rec.members[2].update_norm == 99.0
    assert rec.members[1].verdict == "accepted"
    assert [(e.origin, e.version) for e in rec.expired] == [("12D3KooWold", 3)]
    after = _record(p, _out(), round_no=8)  # the pending lists start over each round
    assert after.refused == ()
    assert after.expired == ()


def test_refusals_from_many_peers_stay_bounded(tmp_path: Path) -> None:
    p = Participation(tmp_path, "weighted")
    for i in range(MAX_REFUSAL_ROWS + 10):
        p.refused(f"12D3KooWstranger{i}", "not_member", 2)
    rec = _record(p, _out())
    assert len(rec.refused) == MAX_REFUSAL_ROWS
    assert rec.refused_more == 20


def test_knowledge_rounds_list_the_origins_used(tmp_path: Path) -> None:
    p = Participation(tmp_path, "weighted")
    rec = p.typed_round(mode=ModeName.KNOWLEDGE, round_no=3, own_id=OWN, used=[(GOOD, 5, 995.0)],
                            clock=Clock.time(1000.0), published=8)
    assert rec.mode == "knowledge"
    assert rec.blend == "none"
    assert [(m.origin, m.alpha, m.staleness) for m in rec.members] == [
        (OWN, None, 0.0), (GOOD, None, 5.0)]


def test_the_control_answer_reads_memory_and_filters_by_round(tmp_path: Path) -> None:
    p = Participation(tmp_path, "weighted")
    for r in (1, 2, 3):
        _record(p, _out(), round_no=r)
    (tmp_path / "rounds.log").unlink()  # the answer does not read the disk
    answer = audit_from_json(p.answer(2))
    assert answer.source == "daemon"
    assert [r.round for r in answer.records] == [2, 3]


def test_an_unusable_state_dir_turns_the_audit_off_not_the_node(tmp_path: Path) -> None:
    (tmp_path / "rounds.log").mkdir()  # not a file: neither read nor appended
    p = Participation(tmp_path, "weighted")
    rec = _record(p, _out())
    assert rec.round == 7
    assert audit_from_json(p.answer(None)).records == ()
