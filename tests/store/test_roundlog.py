"""The participation audit's round log: checksummed lines, bounds, torn tails, restarts."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from peerd.store.roundlog import (
    MAX_ROUND_RECORD_BYTES,
    ROUND_LOG_FILE,
    RoundLine,
    RoundLog,
    parse_log,
    read_round_log,
)


def _bodies(state: Path) -> list[tuple[int, bytes]]:
    return [(r.round, r.body) for r in read_round_log(state).records]


def test_records_survive_a_restart_in_order_and_the_file_is_private(tmp_path: Path) -> None:
    log = RoundLog(tmp_path)
    for i in range(1, 6):
        log.append(i, b'{"round":%d}' % i)
    assert stat.S_IMODE((tmp_path / ROUND_LOG_FILE).stat().st_mode) == 0o600
    again = RoundLog(tmp_path)  # a restart: the writer reloads what the file holds
    assert [r.round for r in again.records()] == [1, 2, 3, 4, 5]
    again.append(6, b"six")
    assert _bodies(tmp_path)[-2:] == [(5, b'{"round":5}'), (6, b"six")]
    assert [r.round for r in again.records(since=4)] == [4, 5, 6]


def test_bounded_by_records_dropping_the_oldest(tmp_path: Path) -> None:
    log = RoundLog(tmp_path, max_records=8)
    for i in range(1, 30):
        log.append(i, b"x")
        assert len(log.records()) <= 8
        assert len(read_round_log(tmp_path).records) <= 8
    kept = [r.round for r in log.records()]
    assert kept[-1] == 29
    assert kept == list(range(kept[0], 30))
    assert [r.round for r in read_round_log(tmp_path).records] == kept


def test_bounded_by_bytes(tmp_path: Path) -> None:
    limit = 4096
    log = RoundLog(tmp_path, max_bytes=limit)
    for i in range(200):
        log.append(i, b"y" * 100)
        assert (tmp_path / ROUND_LOG_FILE).stat().st_size <= limit
    assert log.records()[-1].round == 199
    # A writer opened with smaller bounds cuts an existing file to them at once.
    small = RoundLog(tmp_path, max_records=3)
    assert [r.round for r in small.records()] == [197, 198, 199]
    assert [r.round for r in read_round_log(tmp_path).records] == [197, 198, 199]


def test_a_torn_tail_is_skipped_with_a_warning_and_cut_by_the_next_writer(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = RoundLog(tmp_path)
    log.append(1, b"one")
    log.append(2, b"two")
    path = tmp_path / ROUND_LOG_FILE
    whole = path.read_bytes()
    path.write_bytes(whole + whole.splitlines(keepends=True)[0][:40])  # a torn append
    with caplog.at_level(logging.WARNING):
        found = read_round_log(tmp_path)
    assert [(r.round, r.body) for r in found.records] == [(1, b"one"), (2, b"two")]
    assert found.skipped == 1
    assert "skipped 1 torn or corrupt" in caplog.text
    assert path.read_bytes() != whole  # the read-only reader changed nothing
    RoundLog(tmp_path).append(3, b"three")  # start-up cuts the torn line first
    assert path.read_bytes() == whole + path.read_bytes()[len(whole):]
    assert read_round_log(tmp_path).skipped == 0
    assert _bodies(tmp_path) == [(1, b"one"), (2, b"two"), (3, b"three")]


def test_a_flipped_byte_costs_that_record_only(tmp_path: Path) -> None:
    log = RoundLog(tmp_path)
    for i, body in enumerate((b"a", b"b", b"c"), start=1):
        log.append(i, body)
    path = tmp_path / ROUND_LOG_FILE
    data = bytearray(path.read_bytes())
    second = data.index(b"\n") + 1
    data[second + 67] ^= 0x01  # the second record's body: "b" becomes "c"
    path.write_bytes(bytes(data))
    found = read_round_log(tmp_path)
    assert [r.body for r in found.records] == [b"a", b"c"]
    assert found.skipped == 1


@pytest.mark.parametrize("garbage", [b"", b"\n\n", b"not a record\n", b"\x00" * 300,
                                     b"0" * 64 + b" x y\n", b"0" * 64 + b" -1 y\n"])
def test_garbage_never_crashes_a_reader(garbage: bytes) -> None:
    found = parse_log(garbage)
    assert found.records == ()
    assert found.skipped == sum(1 for line in garbage.split(b"\n")[:-1]) + (
        1 if garbage.split(b"\n")[-1] else 0)


def test_a_record_must_be_one_bounded_line(tmp_path: Path) -> None:
    log = RoundLog(tmp_path)
    with pytest.raises(ValueError, match="one line"):
        log.append(1, b"two\nlines")
    with pytest.raises(ValueError, match="one line"):
        log.append(1, b"z" * (MAX_ROUND_RECORD_BYTES + 1))
    assert log.records() == []
    assert not (tmp_path / ROUND_LOG_FILE).exists()


def test_an_absent_log_reads_empty(tmp_path: Path) -> None:
    assert read_round_log(tmp_path).records == ()
    assert RoundLog(tmp_path).records() == []
    assert RoundLine(1, b"x") == RoundLine(1, b"x")
