"""The local learner's state file: what knowledge and cordial mode learned, kept across restarts.

Weights mode keeps its model as the signed own entry (peerd.store.persist). Knowledge mode
(FedCache's model) and cordial mode (the agent's M_i and Λ_j^i, its optimisers' moments, the
step counter behind its step-size schedules, its random stream) publish something else
(logits, views), so what they learned is kept here: the state-directory blob ``learner``, a
checksummed, atomically written state file (peerd.store.statedir), written after each round.
Its body is a msgpack head followed by the tensors' raw bytes::

    {"format": 1, "mode": "cordial", "identity": {"agent": 2, ...}, "round": 17,
     "counts": {"done_steps": 68, ...}, "tensors": [[name, dtype, shape, offset], ...]}
    <payload: the tensors back to back, laid out by peerd.protocol.tensors>

The tensors use the entries' codec (peerd.protocol.tensors: allow-listed dtypes, decoded with
``numpy.frombuffer``), never pickle or ``torch.load``. On start the file is used only if it is
what the current config builds: the same mode, the same identity (e.g. the agent index) and
exactly the tensor names, dtypes and shapes the learner expects; otherwise one line says why
and the learner starts fresh. A corrupt file is quarantined; one over
:data:`MAX_LEARNER_LEN` is refused before it is read. So is one of this learner that holds
NaN or ±Inf, or values the learner refuses (:func:`refuse`: exploded ones, issue 24): a
diverged agent saved every round would otherwise come back diverged after every restart.

This module owns the format, its limits and that decision. It must not know torch nor what a
tensor means (peerd.learn.learnerstate and the learners do), nor the state-file format
(peerd.store.statefile).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from peerd.protocol import wire
from peerd.protocol.errors import ProtocolError
from peerd.protocol.limits import MAX_ENTRY_HEAD_LEN
from peerd.protocol.tensors import (
    Schema,
    check_against_schema,
    decode_tensors,
    index_from_wire,
    tensor_views,
)
from peerd.store.statedir import StateDir
from peerd.store.statefile import HEADER_LEN

log = logging.getLogger(__name__)

LEARNER_BLOB = "learner"
FORMAT = 1
#: Largest learner file read at start-up (header included), checked before it is read: a
#: corrupt or planted file must not make start-up allocate gigabytes. A learner is its model
#: and at most two optimiser moments per parameter (3x the model): the largest built-in
#: knowledge model ("large", 263,306 parameters, plain SGD) takes 1.05 MB, a cordial agent of
#: 4 agents with Adam 0.76 MB (measured: each saved with peerd.learn.learnerstate.save). A
#: learner whose file would be larger is not saved (logged): never written only to be refused.
MAX_LEARNER_LEN = 1024**3
#: Largest msgpack head (mode, identity, counts, tensor index): an index of 4,096 tensors
#: fits, as in an entry frame's head.
MAX_LEARNER_HEAD_LEN = MAX_ENTRY_HEAD_LEN
#: Most identity fields and counters (each a msgpack map; the wire decoder's map limit).
MAX_LEARNER_FIELDS = 32
_KEYS = frozenset({"format", "mode", "identity", "round", "counts", "tensors"})
_MAX_NAME = 64

Identity = Mapping[str, str | int]


@dataclass(frozen=True, slots=True)
class LearnerState:
    """One learner's state: which learner it is and what it holds.

    ``tensors`` are numpy arrays (bfloat16 ones as their uint16 words, named in
    ``bfloat16``); decoded ones are read-only views of the file's bytes.
    """

    mode: str
    identity: Identity
    #: The node's round when it was saved (the round just finished).
    round: int
    #: Integer counters (steps taken, which optimisers exist, lengths of variable tensors).
    counts: Mapping[str, int]
    tensors: Mapping[str, npt.NDArray[Any]]
    bfloat16: frozenset[str] = field(default_factory=frozenset)


# ---------------------------------------------------------------------------- the format


def encode(state: LearnerState) -> list[bytes | memoryview]:
    """The body as parts (head, then each tensor where it lies: no joined copy)."""
    index, views = tensor_views(state.tensors, state.bfloat16)
    head = wire.pack({"format": FORMAT, "mode": state.mode, "identity": dict(state.identity),
                      "round": state.round, "counts": dict(state.counts),
                      "tensors": [item.to_wire() for item in index]})
    if len(head) > MAX_LEARNER_HEAD_LEN:
        raise ValueError(f"learner head of {len(head)} bytes, over {MAX_LEARNER_HEAD_LEN}")
    return [head, *views]


def _fields(value: Any, what: str, *, numbers_only: bool) -> dict[str, str | int]:
    if type(value) is not dict:
        wire.malformed(f"{what} must be a map")
    if len(value) > MAX_LEARNER_FIELDS:
        wire.malformed(f"{what} has more than {MAX_LEARNER_FIELDS} fields")
    out: dict[str, str | int] = {}
    for key, item in value.items():
        name = wire.as_str(key, f"{what} key", _MAX_NAME)
        if numbers_only or type(item) is not str:
            out[name] = wire.as_int(item, f"{what}.{name}")
        else:
            out[name] = wire.as_str(item, f"{what}.{name}", min_len=0)
    return out


def decode(body: bytes | bytearray | memoryview) -> LearnerState:
    """The state a learner body holds; ValueError (with the reason) if it is not one."""
    try:
        head, consumed = wire.unpack_prefix(body, MAX_LEARNER_HEAD_LEN)
        f = wire.Fields(head, "learner", _KEYS)
        if f.get("format", wire.as_int) != FORMAT:
            wire.malformed(f"not a format-{FORMAT} learner file")
        mode = f.get("mode", wire.as_str, _MAX_NAME)
        identity = _fields(f.raw("identity"), "identity", numbers_only=False)
        counts = {k: int(v) for k, v in
                  _fields(f.raw("counts"), "counts", numbers_only=True).items()}
        round_no = f.get("round", wire.as_int)
        payload = memoryview(body)[consumed:]
        index = index_from_wire(f.raw("tensors"), len(payload))
        tensors = decode_tensors(index, payload)
    except ProtocolError as exc:
        raise ValueError(exc.message) from None
    return LearnerState(mode, identity, round_no, counts, tensors,
                        frozenset(i.name for i in index if i.dtype == "bfloat16"))


def schema_of(state: LearnerState) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (dtype, shape) of what ``state`` holds."""
    index, _ = tensor_views(state.tensors, state.bfloat16)
    return {item.name: (item.dtype, item.shape) for item in index}


def mismatch(saved: LearnerState, mode: str, identity: Identity,
             expected: Callable[[Mapping[str, int]], Schema]) -> str | None:
    """Why ``saved`` is not the learner the current config builds (None: it is).

    ``expected`` gives the exact schema for the saved counters (which optimisers exist, how
    long a variable tensor is); a ValueError from it is a reason too.
    """
    if saved.mode != mode:
        return f"it was saved in {saved.mode} mode, the config runs {mode} mode"
    changed = [f"{key} {saved.identity.get(key)!r} (now {value!r})"
               for key, value in identity.items() if saved.identity.get(key) != value]
    changed += [f"{key} {value!r} (now none)" for key, value in saved.identity.items()
                if key not in identity]
    if changed:
        return "it was saved for another learner: " + ", ".join(changed)
    try:
        schema = expected(saved.counts)
        index, _ = tensor_views(saved.tensors, saved.bfloat16)
        check_against_schema(index, schema)
    except ProtocolError as exc:
        return f"its tensors differ from this config's learner ({exc.message})"
    except ValueError as exc:
        return str(exc)
    return None


def non_finite(state: LearnerState) -> str | None:
    """The first tensor holding NaN or ±Inf, said as a reason (None: all finite). bfloat16
    tensors are their uint16 words: all-ones exponent bits mean NaN or Inf."""
    for name, a in state.tensors.items():
        if name in state.bfloat16:
            bad = bool(np.any((a.view(np.uint16) & 0x7F80) == 0x7F80))
        elif a.dtype.kind == "f":
            bad = not bool(np.isfinite(a).all())
        else:
            continue
        if bad:
            return f"NaN or Inf in {name}: the learner had diverged"
    return None


# ---------------------------------------------------------------------------- the state dir


def refuse(state_dir: StateDir, saved_round: int, problem: str) -> None:
    """One line saying why the saved learner is not restored; the file is quarantined as a
    corrupt one (a read-only state directory keeps it) so the next start does not retry it."""
    why = f"{problem}; the local learner saved after round {saved_round} starts fresh"
    if state_dir.readonly:
        log.warning("not restoring the local learner: %s", why)
    else:
        state_dir.quarantine_file(state_dir.blob_path(LEARNER_BLOB), why)


def save(state_dir: StateDir, state: LearnerState) -> bool:
    """Write ``state`` as the learner file. A failure (disk full, a learner over the limit) is
    logged and returns False: the previous file stays and the node keeps learning."""
    try:
        parts = encode(state)
        size = HEADER_LEN + sum(memoryview(p).nbytes for p in parts)
        if size > MAX_LEARNER_LEN:
            raise ValueError(f"{size} bytes, over the {MAX_LEARNER_LEN}-byte learner limit")
        state_dir.write_blob(LEARNER_BLOB, parts)
    except (OSError, ValueError) as exc:  # StateError is an OSError
        log.error("cannot save the local learner (%s); it keeps learning in memory", exc)
        return False
    return True


def load(state_dir: StateDir, *, mode: str, identity: Identity,
         expected: Callable[[Mapping[str, int]], Schema]) -> LearnerState | None:
    """The saved learner if it is the one the current config builds; else None, with one
    line saying why (a corrupt or oversize file is quarantined, one that decodes but is of
    another learner is left for the next save to replace)."""
    body = state_dir.read_blob(LEARNER_BLOB, max_len=MAX_LEARNER_LEN - HEADER_LEN)
    if body is None:
        return None
    try:
        saved = decode(body)
    except ValueError as exc:
        # Intact checksum but not a learner file: not written by this version of peerd.
        if not state_dir.readonly:
            state_dir.quarantine_file(state_dir.blob_path(LEARNER_BLOB), f"not a learner: {exc}")
        return None
    reason = mismatch(saved, mode, identity, expected)
    if reason is not None:
        log.warning("not restoring the local learner saved after round %d: %s; it starts "
                    "fresh", saved.round, reason)
        return None
    problem = non_finite(saved)
    if problem is not None:
        refuse(state_dir, saved.round, problem)
        return None
    return saved
