"""Saving and restoring a node's entries in its state directory.

Entries are stored as the signed wire frames they are (head + payload): on restart each one
is decoded and verified again exactly like an entry from the network, so a corrupted or
planted file can never put unverified weights into the cache, and nothing is ever
unpickled. Provenance (who relayed it, when) sits in a small JSON index beside them, whose
format peerd.store.statedir owns (the offline status view reads it too): this module must
not parse it, nor the state-file format, itself. The own entry is stored the same way and
must verify against our own key.

The files are also where the daemon *keeps* its entries (see peerd.store.spool): entries are
mapped from them rather than read into memory. A received entry was written to a temporary
file as it arrived and is committed (renamed) here; the own entry is signed into its file.
An entry that could not go to disk (disk full) is held in memory and written here later.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from peerd.core.entry import CacheItem
from peerd.core.reasons import Reason
from peerd.node.state import Held, NodeState, held_signed, sign_params
from peerd.protocol import messages as msg
from peerd.protocol.errors import ProtocolError
from peerd.protocol.manifest import encode_manifest_file
from peerd.store.spool import MappedFrame, open_mapped
from peerd.store.statedir import (
    CACHE_INDEX_BLOB,
    ENTRY_BLOB_PREFIX,
    IndexRow,
    StateDir,
    StateError,
    encode_cache_index,
    read_cache_index,
)

log = logging.getLogger(__name__)

OWN_BLOB = "own.entry"
MANIFEST_BLOB = "manifest"


def _frame(message: msg.Entry) -> list[bytes | memoryview]:
    """The entry frame's body as parts (head, payload): written without joining them."""
    return [message.head(), memoryview(message.payload)]


def _entry_blob(origin: str) -> str:
    return f"{ENTRY_BLOB_PREFIX}{origin}"


def publish_own(
    state: StateDir, node: NodeState, *, params: Mapping[str, torch.Tensor], version: int,
    created_at: float, num_examples: int,
) -> Held:
    """Sign ``params`` as our entry straight into its state file and map it (a worker thread).

    The payload is never assembled in memory: the signature hashes the model's tensors where
    they lie and the file is written from them, so the published entry costs no resident
    model copy. If the file cannot be written (disk full) the entry is built in memory as
    before (one copy) and the error logged: publishing must not stop on a full disk.
    """
    signed = sign_params(node.key, node.fleet_id, params=params, version=version,
                         created_at=created_at, num_examples=num_examples, group=node.group,
                         encoding=node.encoding)
    head = msg.Entry(signed.envelope, b"").head()
    try:
        state.write_blob(OWN_BLOB, [head, *signed.parts])
        frame = open_mapped(state.blob_path(OWN_BLOB), check=False)
    except (StateError, OSError, ValueError) as exc:
        log.error("cannot store the own entry (%s); keeping it in memory", exc)
        return held_signed(signed, signed.to_message(), None)  # the copy the file saved
    return held_signed(signed, _decode_entry(frame, OWN_BLOB), frame)


def save_manifest(state: StateDir, envelope: msg.ManifestMessage) -> None:
    state.write_blob(MANIFEST_BLOB, encode_manifest_file(envelope.envelope))


def save_cache(state: StateDir, node: NodeState, written: set[str]) -> set[str]:
    """Write entries not yet on disk, delete those no longer cached; returns what is on disk.

    Not reentrant: the caller runs one at a time (two at once would race to commit the same
    spooled file and to delete each other's new files).

    ``written`` holds the (origin@version) keys already stored, so a 44 MB entry is written
    once, not every round.
    """
    index = {}
    now_on_disk = set()
    for item in node.cache:
        held = item.payload
        if not isinstance(held, Held):
            continue
        key = f"{item.meta.origin}@{item.meta.version}"
        if held.frame is not None:
            # Mapped from its own file: spooled while it was received and renamed into place
            # here, once. Never written again from the mapping: that would read the whole
            # entry back into memory for nothing.
            if not held.frame.committed:
                held.frame.commit(state.blob_path(_entry_blob(item.meta.origin)))
        elif key not in written:
            state.write_blob(_entry_blob(item.meta.origin), _frame(held.message))
        now_on_disk.add(key)
        index[item.meta.origin] = IndexRow(item.meta.version, item.received_from,
                                           item.received_at)
    state.write_blob(CACHE_INDEX_BLOB, encode_cache_index(index))
    cached = {item.meta.origin for item in node.cache}
    for name in state.list_blobs(ENTRY_BLOB_PREFIX):
        if name.removeprefix(ENTRY_BLOB_PREFIX) not in cached:
            state.delete_blob(name)
    return now_on_disk


@dataclass(frozen=True, slots=True)
class Restored:
    own: bool
    cached: int
    refused: int


def load_manifest(state: StateDir) -> bytes | None:
    """The raw manifest file adopted from peers earlier (verified by the caller)."""
    return state.read_blob(MANIFEST_BLOB)


def _map_blob(state: StateDir, name: str) -> MappedFrame | None:
    """A stored entry, mapped and its file hash checked (piece by piece, pages released);
    None if absent, or if corrupt (then quarantined, like any other state file)."""
    path = state.blob_path(name)
    try:
        return open_mapped(path, check=True)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        state.quarantine_file(path, problem)
        return None


def _decode_entry(frame: MappedFrame, what: str) -> msg.Entry:
    message = msg.decode_frame(frame.body)
    if not isinstance(message, msg.Entry):
        raise ProtocolError(Reason.MALFORMED, f"{what} is not an entry")
    return message


def restore(state: StateDir, node: NodeState, *, now: float) -> Restored:
    """Reload own entry and cache into ``node``, verifying every entry again."""
    own = False
    frame = _map_blob(state, OWN_BLOB)
    if frame is not None:
        try:
            # The node's own verifier: a knowledge node refuses a model kept from weight mode.
            v = node.verifier(_decode_entry(frame, OWN_BLOB), frame, now)()
            if v.entry.meta.origin != node.id:
                raise ProtocolError(Reason.MALFORMED, "own.entry was signed by another key")
            node.set_own(v.entry, v.message, v.frame)
            own = True
        except ProtocolError as exc:
            # Membership may have lapsed or the schema changed: start fresh, keep counters.
            log.warning("not restoring own entry: %s", exc)
    index = read_cache_index(state)
    cached = refused = 0
    for name in state.list_blobs(ENTRY_BLOB_PREFIX):
        frame = _map_blob(state, name)
        if frame is None:
            continue
        try:
            v = node.verifier(_decode_entry(frame, name), frame, now)()
        except ProtocolError as exc:
            refused += 1
            log.warning("not restoring %s: %s", name, exc)
            state.delete_blob(name)
            continue
        prov = index.get(v.entry.meta.origin, IndexRow())
        before = len(node.cache)
        sender = prov.received_from
        node.accept(v, sender="restored" if sender is None else sender, now=now)
        at = prov.received_at
        if at is not None and len(node.cache) > before:
            # Keep the original arrival time rather than the restart time.
            node.cache = [CacheItem(i.meta, i.received_from, float(at), i.payload, i.verified)
                          if i.meta.origin == v.entry.meta.origin else i for i in node.cache]
        cached += len(node.cache) > before
    return Restored(own=own, cached=cached, refused=refused)
