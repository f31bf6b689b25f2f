"""The persisted address book: the members' signed address records and our last record's seq.

Without it a restarted node knows only its bootstrap and static peers again, and a member
that joined through one bootstrap address waits for that one to answer before it finds the
others. The file is the state-directory blob ``addrbook`` (checksummed, written atomically:
peerd.store.statedir), its body msgpack::

    {"format": 1, "own_seq": int, "records": [envelope, ...]}

Each record is kept as received (its signed envelope), so reading it back verifies it as a
peer's record is verified (``AddressBook.restore``): a file edited by hand cannot plant an
address. At most ``MAX_BOOK_ENTRIES`` records are read. This module owns the format only.
"""

from __future__ import annotations

import logging
from typing import Any

from peerd.node.addrbook import MAX_BOOK_ENTRIES, AddressBook
from peerd.protocol.envelope import SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.limits import MAX_INT
from peerd.protocol.wire import Fields, as_int, as_list, malformed, pack, unpack_exact
from peerd.store.statedir import StateDir

log = logging.getLogger(__name__)

ADDRBOOK_BLOB = "addrbook"
FORMAT = 1
#: Largest body read: MAX_BOOK_ENTRIES records of at most ~1 KiB each on the wire.
MAX_ADDRBOOK_LEN = (MAX_BOOK_ENTRIES + 1) * 1024
_KEYS = frozenset({"format", "own_seq", "records"})


def encode(book: AddressBook) -> bytes:
    records = sorted(book.records(), key=lambda r: r.node_id)  # same book, same bytes
    return pack({"format": FORMAT, "own_seq": book.own_seq,
                 "records": [r.envelope.to_wire() for r in records]})


def decode(body: bytes) -> tuple[int, list[SignedEnvelope]]:
    """``(own_seq, envelopes)``; ProtocolError if the body is not an address book."""
    f = Fields(unpack_exact(body, MAX_ADDRBOOK_LEN), "addrbook", _KEYS)
    if f.get("format", as_int) != FORMAT:
        malformed(f"not a format-{FORMAT} address book")
    raw: list[Any] = f.get("records", as_list, MAX_BOOK_ENTRIES)
    return f.get("own_seq", as_int, 0, MAX_INT), [SignedEnvelope.from_wire(r) for r in raw]


def load(state: StateDir) -> tuple[int, list[SignedEnvelope]]:
    """What the file holds; nothing when there is none or it is not one (logged: the book
    then starts empty, and the exchange refills it)."""
    body = state.read_blob(ADDRBOOK_BLOB, MAX_ADDRBOOK_LEN)
    if body is None:
        return 0, []
    try:
        return decode(body)
    except ProtocolError as exc:
        log.error("address book in %s not used (%s): it starts empty", state.path, exc)
        return 0, []


def save(state: StateDir, book: AddressBook) -> None:
    """Write the book atomically (StateError on failure: the previous file stays)."""
    state.write_blob(ADDRBOOK_BLOB, encode(book))
