"""Wiring of the address exchange: the address book between the sessions, the peer table and
the state directory, and ``[network] bootstrap``.

A session hands the book the records it took (``peerd.net.gossip``: verified, members only);
here they become ``exchanged`` hints in the peer table, so a member learned from a peer gets
dialled, and the book is saved once the session is over (``peerd.store.addrfile``). Our own
record is re-signed each sweep from the transport's concrete listen addresses (the book keeps
the held one while they stay the same). Decisions are the book's, the table's and
``peerd.net.bootstrap``'s; this module only connects them.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence

import trio

from peerd.daemon.notices import short_id
from peerd.net.bootstrap import OUT_OF_REACH_S, keep_bootstrapped
from peerd.node.addrbook import AddressBook, Learned, dialable_addrs
from peerd.node.peers import PeerTable
from peerd.store import addrfile
from peerd.store.statedir import StateDir

log = logging.getLogger(__name__)

#: Addresses kept of one member from its record and the rendezvous points together: a
#: record's MAX_RECORD_ADDRS and a few circuits more, each dialled in turn.
MAX_HINT_ADDRS = 8


def _ip_addrs(addrs: Sequence[str]) -> tuple[str, ...]:
    """The addresses the transport dials as they are: a record may name a DNS address (the
    format allows it, ours never do), which only bootstrap entries resolve for now."""
    return tuple(a for a in addrs if a.startswith(("/ip4/", "/ip6/")))


class Addresses:
    def __init__(self, book: AddressBook, peers: PeerTable, state: StateDir,
                 now: Callable[[], float], is_member: Callable[[str], bool],
                 wake: Callable[[], None]) -> None:
        self.book = book
        self._peers = peers
        self._state = state
        self._now = now
        self._is_member = is_member
        self._saved = -1  # the book's revision on disk
        self._lock = threading.Lock()
        self._wake = wake  # a peer to dial now: the gossip loop looks at once

    def restore(self) -> int:
        """The saved book, verified record by record; its members go to the peer table."""
        own_seq, envelopes = addrfile.load(self._state)
        now = self._now()
        taken = self.book.restore(envelopes, own_seq, now, self._is_member)
        for record in self.book.records():
            self._peers.on_exchanged(record.node_id, _ip_addrs(record.addrs), now)
        self._saved = self.book.revision
        return taken

    def learned(self, learned: list[Learned]) -> None:
        """A session's new records (SessionContext.on_addrs, on the loop thread)."""
        now = self._now()
        for item in learned:
            r = item.record
            if self._peers.on_exchanged(r.node_id, _ip_addrs(r.addrs), now):
                log.info("learned %s at %s", short_id(r.node_id), ", ".join(r.addrs))
                self._wake()

    def found(self, node_id: str, addrs: tuple[str, ...]) -> None:
        """A member registered at a relay's rendezvous point (``peerd.net.relayclient``:
        admitted ids only, addresses well-formed): a hint like a record's. Its signed record,
        when the book holds one, comes first, so the two sources do not take turns at the
        peer's addresses (each change would redial it)."""
        held = self.book.get(node_id)
        if held is not None:
            if set(addrs) <= set(held.addrs):
                return
            addrs = tuple(dict.fromkeys((*held.addrs, *addrs)))[:MAX_HINT_ADDRS]
        if self._peers.on_exchanged(node_id, _ip_addrs(addrs), self._now()):
            log.info("found %s at a relay: %s", short_id(node_id), ", ".join(addrs))
            self._wake()

    def sign_own(self, listen: Sequence[str], bound_host: str,
                 circuits: Sequence[str] = (), relay: bool = False) -> None:
        """Our record: the dialable listen addresses and the circuit addresses of the relay
        reservations we hold (``peerd.net.relayclient``), so the exchange spreads both;
        ``relay`` when we run ``[network] relay_service`` (members learn it as a relay)."""
        self.book.sign_own(dialable_addrs(listen, bound_host, circuits), self._now(), relay)

    def prune(self) -> None:
        """A new manifest: records of nodes it no longer admits go."""
        self.book.prune(self._is_member)

    def _save(self) -> None:
        with self._lock:
            revision = self.book.revision
            if revision == self._saved:
                return
            try:
                addrfile.save(self._state, self.book)
            except OSError as exc:  # disk full: the next session's save retries
                log.error("cannot save the address book: %s", exc)
                return
            self._saved = revision

    async def save_if_changed(self) -> None:
        if self.book.revision != self._saved:
            await trio.to_thread.run_sync(self._save)

    async def bootstrap(self, entries: Sequence[str]) -> None:
        """``[network] bootstrap`` for as long as the daemon runs."""
        def add(peer_id: str, addrs: tuple[str, ...]) -> None:
            self._peers.add_bootstrap(peer_id, addrs, self._now())
            self._wake()

        await keep_bootstrapped(
            entries, add=add, rng=random.Random(),
            in_reach=lambda: self._peers.reached(self._now(), OUT_OF_REACH_S),
            retry=self._peers.retry_bootstrap)
