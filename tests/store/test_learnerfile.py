"""The learner file: its format round-trips bit for bit, a file of another learner is ignored
with the reason said, a corrupt one is quarantined, an oversize one is refused before it is
read, and a failed save leaves the old file and raises nothing."""

from __future__ import annotations

import errno
import os
import tracemalloc
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from peerd.protocol import wire
from peerd.protocol.tensors import Schema
from peerd.store import learnerfile
from peerd.store.learnerfile import LEARNER_BLOB, LearnerState
from peerd.store.statedir import StateDir, StateError
from peerd.store.statefile import HEADER_LEN

IDENTITY: dict[str, str | int] = {"agent": 2, "task": "mnist"}


def _state(round_no: int = 7, **counts: int) -> LearnerState:
    rng = np.random.default_rng(round_no)
    tensors: dict[str, npt.NDArray[Any]] = {
        "model.w": rng.standard_normal((3, 4)).astype(np.float32),
        "model.b": rng.standard_normal(4),  # float64
        "model.h": rng.integers(0, 2**16, (5,), dtype=np.uint16),  # bfloat16 words
        "order": rng.permutation(9).astype(np.int64),
        "rng": rng.integers(0, 256, (16,), dtype=np.uint8),
        "step": np.array(3.0, np.float32),  # a 0-d tensor
    }
    return LearnerState("cordial", IDENTITY, round_no, {"done_steps": 12, **counts}, tensors,
                        frozenset({"model.h"}))


def _expected(state: LearnerState) -> Any:
    schema = learnerfile.schema_of(state)

    def expected(counts: Mapping[str, int]) -> Schema:
        return schema

    return expected


def _body(state: LearnerState) -> bytes:
    return b"".join(bytes(p) for p in learnerfile.encode(state))


def test_the_format_round_trips_bit_for_bit() -> None:
    state = _state()
    back = learnerfile.decode(_body(state))
    assert (back.mode, dict(back.identity), back.round, dict(back.counts)) == (
        "cordial", IDENTITY, 7, {"done_steps": 12})
    assert back.bfloat16 == {"model.h"}
    assert sorted(back.tensors) == sorted(state.tensors)
    for name, arr in state.tensors.items():
        got = back.tensors[name]
        assert (got.dtype, got.shape) == (arr.dtype, arr.shape), name
        assert got.tobytes() == arr.tobytes(), name
    assert _body(back) == _body(state)  # one state, one encoding


def test_save_and_load_through_the_state_directory(tmp_path: Path) -> None:
    d = StateDir(tmp_path / "st")
    state = _state()
    assert learnerfile.load(d, mode="cordial", identity=IDENTITY,
                            expected=_expected(state)) is None  # nothing saved yet
    assert learnerfile.save(d, state)
    loaded = learnerfile.load(d, mode="cordial", identity=IDENTITY, expected=_expected(state))
    assert loaded is not None
    assert loaded.round == 7
    for name, arr in state.tensors.items():
        assert loaded.tensors[name].tobytes() == arr.tobytes()
    assert not loaded.tensors["model.w"].flags.writeable  # views of the file's bytes


@pytest.mark.parametrize(("mode", "identity", "expected", "reason"), [
    ("knowledge", IDENTITY, None, "it was saved in cordial mode, the config runs knowledge mode"),
    ("cordial", {"agent": 3, "task": "mnist"}, None,
     "it was saved for another learner: agent 2 (now 3)"),
    ("cordial", {"agent": 2}, None, "it was saved for another learner: task 'mnist' (now none)"),
    ("cordial", {**IDENTITY, "seed": 4}, None,
     "it was saved for another learner: seed None (now 4)"),
    ("cordial", IDENTITY, {"model.w": ("float32", (4, 3))},
     "its tensors differ from this config's learner (tensor names differ"),
    ("cordial", IDENTITY, "shape", "model.w: shape (3, 4), schema has (2, 4)"),
    ("cordial", IDENTITY, "dtype", "model.b: dtype float64, schema has float32"),
    ("cordial", IDENTITY, "refuse", "counters do not fit"),
])
def test_a_file_of_another_learner_is_ignored_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: str, identity: dict[str, Any],
    expected: Any, reason: str,
) -> None:
    d = StateDir(tmp_path / "st")
    state = _state()
    assert learnerfile.save(d, state)
    schema = learnerfile.schema_of(state)
    if expected == "shape":
        schema["model.w"] = ("float32", (2, 4))
    elif expected == "dtype":
        schema["model.b"] = ("float32", (4,))
    elif isinstance(expected, dict):
        schema = expected

    def build(counts: Mapping[str, int]) -> Schema:
        if expected == "refuse":
            raise ValueError("counters do not fit")
        return schema

    with caplog.at_level("WARNING"):
        assert learnerfile.load(d, mode=mode, identity=identity, expected=build) is None
    assert "not restoring the local learner saved after round 7" in caplog.text
    assert reason in caplog.text
    assert "it starts fresh" in caplog.text
    assert d.blob_path(LEARNER_BLOB).exists()  # not corrupt: the next save replaces it
    assert not d.quarantine.exists()


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_a_corrupt_file_is_quarantined_and_nothing_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    d = StateDir(tmp_path / "st")
    state = _state()
    assert learnerfile.save(d, state)
    path = d.blob_path(LEARNER_BLOB)
    data = path.read_bytes()
    if damage == "flip":
        data = data[:-3] + bytes([data[-3] ^ 1]) + data[-2:]
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = b""
    else:
        data = os.urandom(len(data))
    path.write_bytes(data)
    with caplog.at_level("WARNING"):
        assert learnerfile.load(d, mode="cordial", identity=IDENTITY,
                                expected=_expected(state)) is None
    assert "corrupt state file" in caplog.text
    assert not path.exists()
    assert len(list(d.quarantine.iterdir())) == 1


@pytest.mark.parametrize("head", [
    {"format": 2, "mode": "cordial", "identity": {}, "round": 1, "counts": {}, "tensors": []},
    {"format": True, "mode": "cordial", "identity": {}, "round": 1, "counts": {},
     "tensors": []},
    {"format": 1, "mode": "cordial", "identity": {}, "round": 1, "counts": {}},
    {"format": 1, "mode": "cordial", "identity": {}, "round": -1, "counts": {}, "tensors": []},
    {"format": 1, "mode": "cordial", "identity": {"a": 1.5}, "round": 1, "counts": {},
     "tensors": []},
    {"format": 1, "mode": "cordial", "identity": {}, "round": 1, "counts": {"n": "x"},
     "tensors": []},
    {"format": 1, "mode": "cordial", "identity": {}, "round": 1, "counts": {},
     "tensors": [["w", "object", [2], 0]]},
    {"format": 1, "mode": "cordial", "identity": {}, "round": 1, "counts": {},
     "tensors": [["w", "float32", [4], 0]]},  # claims 16 bytes, the payload has none
    {"format": 1, "mode": "cordial", "identity": {}, "round": 1, "counts": {}, "tensors": [],
     "extra": 1},
])
def test_an_intact_file_that_is_not_a_learner_is_quarantined(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, head: dict[str, Any]
) -> None:
    d = StateDir(tmp_path / "st")
    # The same head with nothing wrong decodes: each case fails on its one defect.
    valid = {"format": 1, "mode": "cordial", "identity": {}, "round": 1, "counts": {},
             "tensors": []}
    assert learnerfile.decode(wire.pack(valid)).round == 1
    d.write_blob(LEARNER_BLOB, wire.pack(head))
    with pytest.raises(ValueError):  # noqa: PT011 - each head fails its own check
        learnerfile.decode(d.read_blob(LEARNER_BLOB) or b"")
    with caplog.at_level("WARNING"):
        assert learnerfile.load(d, mode="cordial", identity={},
                                expected=lambda counts: {}) is None
    assert "not a learner" in caplog.text
    assert not d.blob_path(LEARNER_BLOB).exists()


def test_an_oversize_file_is_refused_before_it_is_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = StateDir(tmp_path / "st")
    path = d.blob_path(LEARNER_BLOB)
    with path.open("wb") as fh:  # sparse: one byte over the limit costs no disk
        fh.truncate(learnerfile.MAX_LEARNER_LEN + 1)
    tracemalloc.start()
    try:
        with caplog.at_level("WARNING"):
            assert learnerfile.load(d, mode="cordial", identity={},
                                    expected=lambda counts: {}) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"over the {learnerfile.MAX_LEARNER_LEN - HEADER_LEN}-byte limit" in caplog.text
    assert peak < 1024**2  # refused on its size alone: its gigabyte was never read
    assert not path.exists()  # quarantined


def test_a_learner_over_the_limit_is_not_saved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = StateDir(tmp_path / "st")
    monkeypatch.setattr(learnerfile, "MAX_LEARNER_LEN", 256)
    with caplog.at_level("ERROR"):
        assert not learnerfile.save(d, _state())
    assert "over the 256-byte learner limit" in caplog.text
    assert not d.blob_path(LEARNER_BLOB).exists()


def test_a_failed_save_keeps_the_previous_file_and_raises_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = StateDir(tmp_path / "st")
    old = _state(3)
    assert learnerfile.save(d, old)

    def full(name: str, data: object) -> None:
        raise StateError(errno.ENOSPC, "cannot write learner: No space left (disk full)")

    monkeypatch.setattr(d, "write_blob", full)
    with caplog.at_level("ERROR"):
        assert not learnerfile.save(d, _state(4))
    assert "cannot save the local learner" in caplog.text
    assert "disk full" in caplog.text
    kept = learnerfile.load(d, mode="cordial", identity=IDENTITY, expected=_expected(old))
    assert kept is not None
    assert kept.round == 3
