"""peerd.store.partials' bounds: how many cut transfers are kept, for how long, and which are
not worth keeping (each a file that a member cutting transfers on purpose could pile up)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from peerd.protocol import messages as msg
from peerd.store.partials import Partials
from peerd.store.spool import Cut
from peerd.store.statefile import HEADER_LEN
from tests.protocol.helpers import entry


def cut_file(directory: Path, version: int, keep_payload: int) -> Cut:
    """A spooled prefix of an entry frame: its head and ``keep_payload`` payload bytes."""
    e = entry(version=version)
    body = e.head() + bytes(e.payload)
    kept = body[: len(e.head()) + keep_payload]
    path = directory / f".tmp-recv-{version}"
    path.write_bytes(bytes(HEADER_LEN) + kept)
    return Cut(path, len(body), len(kept), hashlib.sha256(kept))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_at_most_max_partials_are_kept_the_oldest_unclaimed_going_first(tmp_path: Path) -> None:
    clock = Clock()
    p = Partials(max_partials=2, min_bytes=1, clock=clock)
    cuts = [cut_file(tmp_path, v, 8) for v in (1, 2, 3)]
    for c in cuts:
        clock.t += 1
        assert p.keep(c) is not None
    assert len(p) == 2
    assert not cuts[0].path.exists()  # the oldest went, file and all
    assert cuts[1].path.exists()
    assert cuts[2].path.exists()


def test_too_little_to_resume_or_no_entry_head_is_deleted_at_once(tmp_path: Path) -> None:
    p = Partials(min_bytes=16)
    small = cut_file(tmp_path, 1, 8)
    assert p.keep(small) is None
    assert not small.path.exists()
    junk = tmp_path / ".tmp-recv-junk"
    junk.write_bytes(bytes(HEADER_LEN) + b"\x81\xa4type")  # a map cut inside its first key
    assert p.keep(Cut(junk, 1000, 6, hashlib.sha256())) is None
    assert not junk.exists()
    assert len(p) == 0


def test_a_partial_expires_unless_a_session_holds_it(tmp_path: Path) -> None:
    clock = Clock()
    p = Partials(min_bytes=1, ttl_s=60, clock=clock)
    kept = p.keep(cut_file(tmp_path, 1, 8))
    assert kept is not None
    item = msg.DigestItem(kept.origin, 1, 0.0, kept.digest)
    want = p.resume(7, msg.Want(((kept.origin, 1),)), msg.Digest((item,)))
    assert want.offsets == (8,)
    clock.t = 120
    p.keep(cut_file(tmp_path, 2, 8))  # expiry runs: the claimed one stays
    assert p.take(7, kept.origin, 1) is kept
    assert kept.cut.path.exists()
    # An unclaimed one goes once its time is up.
    clock.t = 300
    assert p.resume(8, msg.Want(((kept.origin, 2),)), msg.Digest(())).offsets == ()
    assert len(p) == 0
