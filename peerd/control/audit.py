"""The participation audit as typed values, its one JSON codec, and its control request.

One :class:`RoundRecord` per round: which models were blended and with what α (the plan's)
and weight (what each counted for after update-norm validation and the blend rule), their
staleness and drift, the entries refused since the previous round with their reasons, the
entries that expired and those withdrawn (their origin flagged or gone from the manifest),
and, with a learner of the user's, the metrics its fit and evaluation returned or why the
round was refused (:class:`AuditLearner`).
The daemon writes them to the state directory's round log (:mod:`peerd.store.roundlog`,
one JSON record a line); ``peerd audit`` reads them from the daemon (the control API's
``audit`` method, :func:`request_audit`) or, with the daemon down, from that log
(:func:`read_offline`). Either way the answer is an :class:`Audit` saying which source it
came from.

The dataclasses are the schema, with :mod:`peerd.control.jsoncodec`'s rules (a key's JSON
name is the field's name; NaN or infinite optional numbers are ``null``; unknown keys are
ignored). Pure and light like the status module: it must not import the daemon, torch or the
transport.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from peerd.control.client import DEFAULT_TIMEOUT_S, decode_result, request
from peerd.control.jsoncodec import Codec
from peerd.store.roundlog import RoundLine, read_round_log

#: A member's verdict under update-norm validation ("accepted" when it is off).
Verdict = Literal["accepted", "clipped", "rejected"]


@dataclass(frozen=True, slots=True)
class AuditMember:
    """One model in a round's blend plan (the own model first, then the cache's)."""

    origin: str
    #: The entry's version; None for the own model (the one being trained).
    version: int | None
    #: The plan's α (None in knowledge mode: distillation has no weights).
    alpha: float | None
    #: What it counted for in the blend after validation and the rule (clipped, Krum: their
    #: weights; 0: rejected or not selected); None where the rule has none (median, trimmed
    #: mean, knowledge mode).
    weight: float | None
    #: Its staleness at the round, in the node's unit (seconds or rounds); 0 for the own model.
    staleness: float | None
    #: ‖x_trained − x_j‖ after the round (None for the own model, or not measured).
    drift: float | None
    #: ‖x_j − x_own‖ before the blend (update-norm validation on), else None.
    update_norm: float | None
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class AuditRefusal:
    """Entries a peer sent that were refused, by reason, since the previous round (or, for a
    model rejected at the blend, its origin and ``update_norm_too_large``)."""

    peer: str
    reason: str
    count: int


@dataclass(frozen=True, slots=True)
class AuditExpired:
    origin: str
    version: int


@dataclass(frozen=True, slots=True)
class AuditWithdrawn:
    """A held entry taken out before the round's blend: its origin was flagged
    (``equivocation``) or left the manifest (``revoked``, ``not_member``, ``expired``)."""

    origin: str
    version: int
    reason: str


@dataclass(frozen=True, slots=True)
class AuditLearner:
    """A round trained by a learner of the user's (``[learner] kind`` python or flower).

    The metrics are as the learner returned them after peerd's checks
    (peerd.learn.learner.check: at most 32 finite numbers a result, names of at most 64
    printable characters), so a record stays small whatever the learner does."""

    #: What ``fit`` returned (empty when the fit failed).
    fit_metrics: Mapping[str, float]
    #: What ``evaluate`` returned (empty when the fit or the evaluation failed).
    eval_metrics: Mapping[str, float]
    #: Why the round was refused (peerd.learn.learner.contract.Refusal's value), else None;
    #: with its bounded one-line detail.
    failure: str | None
    detail: str | None


AuditMode = Literal["weights", "knowledge", "cordial", "sensors"]


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """One round of one node, as the audit log keeps it."""

    #: The round's number as the daemon's log and status show it (1 for the first round).
    round: int
    ts: float  # when the round ended, seconds since the epoch
    #: The learning mode (peerd.core.modes.ModeName's values): cordial and sensor rounds
    #: were recorded as "knowledge" before the modes had one round (issue 25).
    mode: AuditMode
    blend: str  # the configured rule ("weighted", "clipped:1.0", …; "none" in knowledge mode)
    members: tuple[AuditMember, ...]
    refused: tuple[AuditRefusal, ...]
    #: Refusals not listed (past the record's bound on distinct peer/reason pairs).
    refused_more: int
    expired: tuple[AuditExpired, ...]
    #: Why the rule blended nothing (Krum with too few models), else None.
    blend_refused: str | None
    #: The version published this round, else None.
    published: int | None
    #: Held entries withdrawn since the previous round (issue 24); absent in older logs.
    withdrawn: tuple[AuditWithdrawn, ...] = ()
    #: A learner of the user's: its metrics this round, or its failure; None for the builtin
    #: learner and other modes, and absent in logs written before issue 26 (read as None).
    learner: AuditLearner | None = None


@dataclass(frozen=True, slots=True)
class Audit:
    """What ``peerd audit --json`` prints: the records, and where they were read."""

    source: Literal["daemon", "state_dir"]
    records: tuple[RoundRecord, ...]
    #: Records skipped as torn, corrupt or not of this schema.
    skipped: int


_RECORD = Codec(RoundRecord)
_AUDIT = Codec(Audit)


def record_to_json(record: RoundRecord) -> dict[str, Any]:
    return _RECORD.to_json(record)


def record_from_json(obj: Any) -> RoundRecord:
    """A :class:`RoundRecord`; :class:`StatusError` naming every shape problem."""
    if isinstance(obj, dict):  # keys later versions added: an older log still reads
        obj = {"withdrawn": [], "learner": None, **obj}  # issue 24; issue 26
    return _RECORD.from_json(obj)


def encode_record(record: RoundRecord) -> bytes:
    """The round log's body of a record: one line of ASCII JSON."""
    return json.dumps(record_to_json(record), ensure_ascii=True,
                      separators=(",", ":")).encode()


def audit_to_json(audit: Audit) -> dict[str, Any]:
    return _AUDIT.to_json(audit)


def audit_from_json(obj: Any) -> Audit:
    return _AUDIT.from_json(obj)


def decode_lines(lines: list[RoundLine], source: Literal["daemon", "state_dir"],
                 skipped: int = 0) -> Audit:
    """The audit of round-log records; a body that is not a record counts as skipped."""
    records: list[RoundRecord] = []
    for line in lines:
        try:
            records.append(record_from_json(json.loads(line.body)))
        except (ValueError, UnicodeDecodeError):  # StatusError is a ValueError
            skipped += 1
    return Audit(source=source, records=tuple(records), skipped=skipped)


def read_offline(state_dir: Path, since: int | None = None) -> Audit:
    """The audit as the state directory holds it (read-only, while the daemon is down);
    OSError when it cannot be read."""
    found = read_round_log(state_dir)
    lines = [r for r in found.records if since is None or r.round >= since]
    return decode_lines(lines, "state_dir", found.skipped)


def request_audit(socket_path: Path, since: int | None = None,
                  timeout: float = DEFAULT_TIMEOUT_S) -> Audit:
    """Ask the running daemon for its audit (rounds >= ``since``); ControlError as
    :func:`peerd.control.client.request`."""
    params = {} if since is None else {"since": since}
    return decode_result(socket_path, audit_from_json,
                         request(socket_path, "audit", timeout, params))
