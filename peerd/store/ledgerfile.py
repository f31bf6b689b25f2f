"""The persisted origin ledger: per-origin version high-water marks and equivocation flags.

Without it a restart forgets two things the cache alone cannot rebuild: that an origin was
caught equivocating (its flag would silently lapse), and the highest version accepted of an
origin whose entry was evicted or expired (an older but still fresh version of it would be
accepted again). The daemon loads it at start, after the cache was restored from its entries,
and merges the two (``NodeState.restore_ledger``); it saves it after every session that
changed it. ``peerd flags`` lists and clears flags through the daemon, or here while the
daemon is down.

The file is the state-directory blob ``ledger`` (a checksummed, atomically written state
file: peerd.store.statedir), its body JSON::

    {"format": 1,
     "held": {"<origin>": {"version": 7, "digest": "<sha256 hex>", "created_at": 1.7e9}},
     "flagged": ["<origin>", ...]}

It is bounded by the fleet's size (the node keeps rows only for members of its manifest);
a file with more than :data:`MAX_LEDGER_ROWS` origins is not loaded. This module owns the
format; it must not decide what the ledger means (``peerd.protocol.ledger``) nor touch the
node state.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from types import MappingProxyType
from typing import Any

from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import as_node_id
from peerd.protocol.ledger import Held, LedgerView
from peerd.protocol.limits import MAX_MEMBERS, MAX_VERSION
from peerd.store.statedir import StateDir

log = logging.getLogger(__name__)

LEDGER_BLOB = "ledger"
FORMAT = 1
#: Most origins read from a ledger file (held rows, and flags, each): the node keeps rows
#: only for its manifest's members, and itself. A file claiming more was not written by us;
#: the excess must not grow the node's memory.
MAX_LEDGER_ROWS = MAX_MEMBERS + 1
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def encode(view: LedgerView) -> bytes:
    """The ``ledger`` body for ``view`` (sorted, so an unchanged ledger gives the same bytes)."""
    return json.dumps({
        "format": FORMAT,
        "held": {origin: {"version": row.version, "digest": row.digest,
                          "created_at": row.created_at}
                 for origin, row in sorted(view.held.items())},
        "flagged": sorted(view.flagged),
    }).encode()


def _origin(value: Any) -> str:
    try:
        return as_node_id(value, "origin")
    except ProtocolError as exc:
        raise ValueError(exc.message) from None


def _row(value: Any) -> Held:
    if not isinstance(value, dict):
        raise ValueError("a held row is not an object")
    version, digest, created_at = value.get("version"), value.get("digest"), value.get(
        "created_at")
    if type(version) is not int or not 0 <= version <= MAX_VERSION:
        raise ValueError(f"bad version {version!r}")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise ValueError("bad digest")
    if created_at is not None and (type(created_at) not in (int, float) or created_at < 0):
        raise ValueError(f"bad created_at {created_at!r}")
    return Held(version, digest, None if created_at is None else float(created_at))


def decode(body: bytes) -> LedgerView:
    """The ledger a ``ledger`` body holds; ValueError (with the reason) if it is not one."""
    raw = json.loads(body)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"not a format-{FORMAT} ledger")
    held_raw, flagged_raw = raw.get("held"), raw.get("flagged")
    if not isinstance(held_raw, dict) or not isinstance(flagged_raw, list):
        raise ValueError("held must be an object and flagged a list")
    if len(held_raw) > MAX_LEDGER_ROWS or len(flagged_raw) > MAX_LEDGER_ROWS:
        raise ValueError(f"more than {MAX_LEDGER_ROWS} origins")
    held = {_origin(origin): _row(row) for origin, row in held_raw.items()}
    flagged = frozenset(_origin(origin) for origin in flagged_raw)
    return LedgerView(MappingProxyType(held), flagged)


def load(state: StateDir) -> LedgerView | None:
    """The persisted ledger; None when there is none, or it is corrupt (a torn or flipped
    file is quarantined by the state directory; nonsense inside an intact one is logged)."""
    body = state.read_blob(LEDGER_BLOB)
    if body is None:
        return None
    try:
        return decode(body)
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        log.error("ledger file in %s not used (%s): equivocation flags and version "
                  "high-water marks start from the restored cache", state.path, exc)
        return None


def save(state: StateDir, view: LedgerView) -> None:
    """Write ``view`` atomically (StateError on failure: the previous file stays)."""
    state.write_blob(LEDGER_BLOB, encode(view))


class Saver:
    """Writes a node's ledger snapshots to its state directory, newest only: from worker
    threads (sessions that end together each save), one at a time, never an older snapshot
    over a newer one (:attr:`LedgerView.revision` orders them)."""

    def __init__(self, state: StateDir) -> None:
        self._state = state
        self._lock = threading.Lock()
        self._saved = -1  # the revision on disk

    def stale(self, view: LedgerView) -> bool:
        """Whether ``view`` is newer than what is on disk (nothing to write otherwise)."""
        return view.revision > self._saved

    def save(self, view: LedgerView) -> bool:
        """Write ``view`` unless something as new is on disk. A failure (disk full) is logged
        and returns False: the revision on disk did not move, the next save retries."""
        with self._lock:
            if view.revision <= self._saved:
                return True
            try:
                save(self._state, view)
            except OSError as exc:  # StateError included
                log.error("cannot save the ledger: %s", exc)
                return False
            self._saved = view.revision
            return True


def clear_flag(state: StateDir, origin: str) -> bool:
    """Clear ``origin``'s flag in the persisted ledger, for when the daemon is down (a
    running daemon would write its own flags over it). True if it was flagged."""
    view = load(state)
    if view is None or origin not in view.flagged:
        return False
    save(state, LedgerView(view.held, view.flagged - {origin}))
    return True
