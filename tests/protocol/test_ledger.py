"""The origin ledger: versions bounded by what time allows (issue 12 item 14), immutable
snapshots for worker threads (item 4), and what a persisted ledger merges into (item 13)."""

from __future__ import annotations

import threading
from types import MappingProxyType

import pytest

from peerd.core.reasons import Reason
from peerd.protocol.admission import admit_entry
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import node_id_of
from peerd.protocol.ledger import EquivocationError, Held, LedgerView, OriginLedger, version_limit
from peerd.protocol.limits import (
    MAX_INT,
    MAX_VERSION,
    MAX_VERSIONS_PER_S,
    VERSION_EPOCH_S,
    VERSION_SLACK,
)
from peerd.protocol.messages import Entry
from tests.protocol.helpers import ALICE, BOB, NOW, admit_kwargs, entry

ORIGIN = node_id_of(ALICE)
DIGEST = "ab" * 32


def refused(message: Entry, ledger: OriginLedger | LedgerView) -> Reason:
    with pytest.raises(ProtocolError) as exc:
        admit_entry(message, **admit_kwargs(ledger), record=False)
    return exc.value.reason


# ---------------------------------------------------------------------------- item 14


def test_the_int64_ceiling_is_refused_from_a_first_seen_origin_and_after_a_held_one() -> None:
    assert refused(entry(version=MAX_INT), OriginLedger()) is Reason.VERSION_TOO_HIGH
    ledger = OriginLedger()
    admit_entry(entry(version=3), **admit_kwargs(ledger))
    assert refused(entry(version=MAX_INT), ledger) is Reason.VERSION_TOO_HIGH
    # The origin can still publish its next version: nothing was recorded.
    admit_entry(entry(version=4), **admit_kwargs(ledger))
    assert ledger.held[ORIGIN].version == 4


def test_a_jump_too_large_for_the_elapsed_time_is_refused_and_allowed_once_time_passed() -> None:
    ledger = OriginLedger()
    admit_entry(entry(version=10), **admit_kwargs(ledger))
    jump = 10 + VERSION_SLACK + 10 * MAX_VERSIONS_PER_S  # what 10 s allow, plus one
    too_soon = entry(version=jump + 1, created_at=NOW + 10)
    assert refused(too_soon, ledger) is Reason.VERSION_TOO_HIGH
    with pytest.raises(ProtocolError, match="more than time allows"):
        ledger.view().check(ORIGIN, jump + 1, DIGEST, NOW + 10)
    # The same version created a second later is within the bound (and the clock skew).
    admit_entry(entry(version=jump + 1, created_at=NOW + 11), **admit_kwargs(ledger, now=NOW + 11))
    assert ledger.held[ORIGIN].version == jump + 1


def test_honest_increments_pass_even_after_a_clock_step_back() -> None:
    ledger = OriginLedger()
    at = NOW
    for version in range(1, 40):
        admit_entry(entry(version=version, created_at=at), **admit_kwargs(ledger, now=at))
        at += 1.0  # one publish a second: a round interval far below the default's 10 s
    # The origin's clock steps back ten minutes: its next entry is "older", one version newer.
    admit_entry(entry(version=40, created_at=at - 600), **admit_kwargs(ledger, now=at))
    assert ledger.held[ORIGIN].version == 40


def test_the_bound_itself() -> None:
    first = version_limit(None, VERSION_EPOCH_S + 3600)
    assert first == VERSION_SLACK + 3600 * MAX_VERSIONS_PER_S
    held = Held(1000, DIGEST, NOW)
    assert version_limit(held, NOW + 2) == 1000 + VERSION_SLACK + 2 * MAX_VERSIONS_PER_S
    assert version_limit(held, NOW - 60) == 1000 + VERSION_SLACK  # an older clock: slack only
    # The node's own origin is bound only absolutely: after a state loss its held (new)
    # entry may be newer in time yet far lower in version than one of its old ones.
    assert version_limit(held, NOW - 60, owner=True) == version_limit(None, NOW - 60)
    assert version_limit(None, 1e30) == MAX_VERSION
    assert version_limit(Held(5, DIGEST, None), NOW) == version_limit(None, NOW)


def test_the_owner_may_learn_a_far_older_entry_of_its_own_back() -> None:
    ledger = OriginLedger(owner=ORIGIN)
    ledger.record(ORIGIN, 1, DIGEST, NOW)  # what it published after losing its state
    admit_entry(entry(version=5000, created_at=NOW - 3600), **admit_kwargs(ledger))
    assert ledger.held[ORIGIN].version == 5000
    other = OriginLedger()
    other.record(ORIGIN, 1, DIGEST, NOW)
    assert refused(entry(version=5000, created_at=NOW - 3600), other) is Reason.VERSION_TOO_HIGH


# ---------------------------------------------------------------------------- item 4


def test_a_view_is_an_immutable_copy_and_checking_it_changes_nothing() -> None:
    ledger = OriginLedger()
    ledger.record(ORIGIN, 3, DIGEST, NOW)
    view = ledger.view()
    assert isinstance(view.held, MappingProxyType)
    assert isinstance(view.flagged, frozenset)
    with pytest.raises(TypeError):
        view.held[ORIGIN] = Held(9, DIGEST)  # type: ignore[index]
    ledger.record(ORIGIN, 4, DIGEST, NOW)  # the live ledger moves on; the copy does not
    assert view.held[ORIGIN].version == 3
    with pytest.raises(EquivocationError) as exc:
        view.check(ORIGIN, 3, "cd" * 32, NOW)
    assert exc.value.origin == ORIGIN
    assert exc.value.reason is Reason.EQUIVOCATION
    assert not view.flagged
    assert not ledger.flagged  # flagging is the owner's: OriginLedger.flag on its thread
    with pytest.raises(EquivocationError):
        ledger.check(ORIGIN, 4, "cd" * 32, NOW)
    assert ledger.flagged == {ORIGIN}


def test_admission_against_a_view_records_nothing_and_refuses_to_be_asked_to() -> None:
    ledger = OriginLedger()
    admit_entry(entry(version=3), **admit_kwargs(ledger.view()), record=False)
    assert ledger.held == {}
    with pytest.raises(TypeError):
        admit_entry(entry(version=3), **admit_kwargs(ledger.view()))


def test_a_view_is_checked_in_another_thread_while_the_owner_changes_the_ledger() -> None:
    # The race of issue 12 item 4: before, the worker flagged in the live set while the
    # loop iterated it. A view shares nothing mutable with the ledger.
    ledger = OriginLedger()
    ledger.record(ORIGIN, 3, DIGEST, NOW)
    view = ledger.view()
    errors: list[BaseException] = []

    def worker() -> None:
        for _ in range(2000):
            try:
                view.check(ORIGIN, 3, "cd" * 32, NOW)
            except EquivocationError:
                pass
            except BaseException as exc:  # noqa: BLE001 - reported on the test's thread
                errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    for i in range(2000):
        ledger.flag(f"origin-{i}")
        sorted(ledger.flagged)
    thread.join()
    assert errors == []
    assert view.flagged == frozenset()


# ---------------------------------------------------------------------------- item 13


def test_merge_keeps_the_higher_version_and_every_flag_and_bumps_the_revision() -> None:
    bob = node_id_of(BOB)
    live = OriginLedger(owner=ORIGIN)
    live.record(ORIGIN, 2, DIGEST, NOW)
    live.record(bob, 9, DIGEST, NOW)
    stored = LedgerView(MappingProxyType({ORIGIN: Held(7, DIGEST, NOW - 5),
                                          bob: Held(4, DIGEST, NOW - 5)}),
                        frozenset({bob}))
    before = live.revision
    live.merge(stored)
    assert live.held[ORIGIN].version == 7
    assert live.held[bob].version == 9
    assert live.flagged == {bob}
    assert live.revision > before


def test_the_owner_is_never_flagged_and_a_flag_is_cleared_by_hand() -> None:
    ledger = OriginLedger(owner=ORIGIN)
    ledger.flag(ORIGIN)
    assert ledger.flagged == set()
    ledger.flag("x")
    revision = ledger.revision
    assert ledger.clear_flag("x")
    assert not ledger.clear_flag("x")
    assert ledger.revision == revision + 1


def test_retain_keeps_members_and_the_owner() -> None:
    ledger = OriginLedger(owner=ORIGIN)
    for origin in (ORIGIN, "a", "b"):
        ledger.record(origin, 1, DIGEST, NOW)
    ledger.flag("b")
    ledger.retain(["a"])
    assert set(ledger.held) == {ORIGIN, "a"}
    assert ledger.flagged == set()


def test_a_snapshot_taken_before_a_flag_was_cleared_does_not_set_it_again() -> None:
    ledger = OriginLedger()
    ledger.flag(ORIGIN)
    view = ledger.view()  # a worker is verifying an entry of ORIGIN ...
    assert ledger.clear_flag(ORIGIN)  # ... while the operator clears the flag
    with pytest.raises(ProtocolError) as exc:
        view.check(ORIGIN, 9, DIGEST, NOW)
    assert exc.value.reason is Reason.EQUIVOCATION
    assert not isinstance(exc.value, EquivocationError)  # so the loop does not re-flag it
