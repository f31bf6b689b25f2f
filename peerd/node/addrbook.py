"""The address book: the signed address records a node holds of other members, and its own.

Records come from the sessions' address exchange (``peerd.protocol.peerrecord``): each was
verified against its subject's key before it got here, and only members' records are kept
or handed on (the caller judges membership under the manifest it holds; :meth:`prune`
drops those a newer manifest no longer admits). Per member the record with the highest
``seq`` is kept; an older or equal one changes nothing. A record past its ``expires`` is
gone (:meth:`expire`). The book holds at most :data:`MAX_BOOK_ENTRIES` records (a record
holds at most ``MAX_RECORD_ADDRS`` addresses), so what peers hand us is bounded twice.

Our own record is signed here with the addresses we can be dialled at
(:func:`dialable_addrs`), re-signed when they change or half its life has gone, with a
``seq`` that never goes back (the milliseconds of ``now``, or one more than the last).

Pure bookkeeping: ``now`` is passed in; the file is ``peerd.store.addrfile``'s, the table
of whom to dial ``peerd.node.peers``'s.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.protocol.envelope import SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import node_id_of
from peerd.protocol.limits import MAX_ADDR_RECORDS, MAX_MEMBERS, MAX_RECORD_ADDRS
from peerd.protocol.peerrecord import (
    PeerRecord,
    check_circuit,
    check_multiaddr,
    is_circuit,
    sign_record,
    verify_record,
)

#: Records held, besides our own. Threat: a book fed from the network; members only are
#: kept, and a manifest lists at most MAX_MEMBERS, so a fleet never reaches it. When full,
#: the record that expires first makes room.
MAX_BOOK_ENTRIES = MAX_MEMBERS
#: How long our own record is valid: long enough to outlive a night without sessions,
#: short enough that a host that moved is forgotten within hours (MAX_RECORD_TTL_S: 24 h).
OWN_RECORD_TTL_S = 6 * 3600.0
#: Places of our record kept for circuit addresses (``[network] relays``) when we hold
#: reservations: a NAT'd member's direct addresses reach only its own site, its circuits
#: every other one, so neither kind may crowd the other out of MAX_RECORD_ADDRS.
CIRCUIT_PLACES = 2


def dialable_addrs(listen: Sequence[str], bound_host: str,
                   circuits: Sequence[str] = ()) -> tuple[str, ...]:
    """What peers can dial of our (concrete) listen addresses: no wildcard, multicast or
    link-local host; a loopback one only when we are bound to loopback itself (a daemon on
    0.0.0.0 also answers on 127.0.0.1, but that address means another host to a peer).
    Then our ``circuits`` (relay reservations held now), in at least CIRCUIT_PLACES of the
    record's places; direct addresses first (peers prefer a direct path that works)."""
    try:
        bound_loopback = ipaddress.ip_address(bound_host).is_loopback
    except ValueError:
        bound_loopback = False
    out: list[str] = []
    for addr in listen:
        try:
            check_multiaddr(addr)
        except ProtocolError:
            continue
        host = addr.split("/")[2]
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:  # a DNS name: dialable as far as we can tell
            out.append(addr)
            continue
        if ip.is_link_local or (ip.is_loopback and not bound_loopback):
            continue
        out.append(addr)
    relayed: list[str] = []
    for addr in circuits:
        try:
            relayed.append(check_circuit(addr))
        except ProtocolError:
            continue
    relayed = list(dict.fromkeys(relayed))
    direct = list(dict.fromkeys(out))[:MAX_RECORD_ADDRS - min(len(relayed), CIRCUIT_PLACES)]
    return tuple(direct + relayed)[:MAX_RECORD_ADDRS]


@dataclass(frozen=True, slots=True)
class Learned:
    """A record taken into the book: new addresses (or a new member) for the peer table."""

    record: PeerRecord
    new_addrs: bool


class AddressBook:
    """Members' address records for the node ``self_id``, and its own."""

    def __init__(self, key: Ed25519PrivateKey, fleet_id: bytes) -> None:
        self._key = key
        self.self_id = node_id_of(key)
        self.fleet_id = fleet_id
        self._records: dict[str, PeerRecord] = {}
        self.own: PeerRecord | None = None
        self._floor = 0  # the seq of our last record before a restart (restore)
        #: Counters for the status: records taken in, and refused by why (hostile ones end
        #: the session they came in; expired and non-members' ones are only skipped).
        self.taken = 0
        self.skipped = 0
        #: Bumped on every change: the daemon saves the book when it moved.
        self.revision = 0

    def __len__(self) -> int:
        return len(self._records)

    def get(self, node_id: str) -> PeerRecord | None:
        return self._records.get(node_id)

    def records(self) -> list[PeerRecord]:
        return list(self._records.values())

    # ------------------------------------------------------------------ our own record
    def sign_own(self, addrs: Sequence[str], now: float,
                 relay: bool = False) -> PeerRecord | None:
        """Our record for ``addrs`` (None when none is dialable): the held one while it names
        the same addresses and ``relay`` (we run a relay service) and has more than half its
        life ahead, else a new one."""
        if not addrs:
            self.own = None
            return None
        own = self.own
        if own is not None and own.addrs == tuple(addrs) and own.relay == relay and \
                own.expires - now > OWN_RECORD_TTL_S / 2:
            return own
        seq = max(int(now * 1000), self.own_seq + 1)
        self.own = sign_record(self._key, self.fleet_id, seq=seq, addrs=addrs,
                               expires=now + OWN_RECORD_TTL_S, relay=relay)
        self.revision += 1
        return self.own

    # ------------------------------------------------------------------ others' records
    def offer(self, record: PeerRecord) -> Learned | None:
        """Take a verified member's record; None if it is ours, not newer than the held one,
        or the book is full of records that outlive it."""
        if record.node_id == self.self_id:
            return None
        held = self._records.get(record.node_id)
        if held is not None and record.seq <= held.seq:
            return None
        if held is None and len(self._records) >= MAX_BOOK_ENTRIES:
            first = min(self._records.values(), key=lambda r: r.expires)
            if first.expires >= record.expires:
                return None
            del self._records[first.node_id]
        self._records[record.node_id] = record
        self.taken += 1
        self.revision += 1
        return Learned(record, held is None or set(record.addrs) != set(held.addrs))

    def receive(self, envelopes: Iterable[SignedEnvelope], now: float,
                is_member: Callable[[str], bool]) -> list[Learned]:
        """An Addrs message's records: each verified (a forged or malformed one raises
        ProtocolError: the peer handed on something no honest holder keeps), an expired one
        or a non-member's skipped (a clock or manifest a little apart from ours)."""
        learned: list[Learned] = []
        for envelope in envelopes:
            try:
                record = verify_record(envelope, self.fleet_id, now)
            except ProtocolError as exc:
                if exc.reason == "expired":
                    self.skipped += 1
                    continue
                raise
            if not is_member(record.node_id):
                self.skipped += 1
                continue
            got = self.offer(record)
            if got is not None:
                learned.append(got)
        return learned

    def outgoing(self, now: float, is_member: Callable[[str], bool],
                 exclude: str | None = None, *,
                 circuits: bool = True, relays: bool = True) -> tuple[SignedEnvelope, ...]:
        """What we hand a peer: our record first, then the members' records that expire
        last (the freshest), at most MAX_ADDR_RECORDS; never the peer's own (it knows).
        Without ``circuits`` (a peer of a release before circuit addresses), no record
        holding one: that peer would end the session on it; likewise without ``relays``, no
        record with the ``relay`` field."""
        self.expire(now)

        def sendable(r: PeerRecord) -> bool:
            return (circuits or not any(is_circuit(a) for a in r.addrs)) and \
                (relays or not r.relay)

        own = self.own
        out = [own.envelope] if own is not None and own.expires > now and sendable(own) \
            else []
        others = sorted((r for r in self._records.values()
                         if r.node_id != exclude and is_member(r.node_id) and sendable(r)),
                        key=lambda r: (-r.expires, r.node_id))
        out += [r.envelope for r in others[:MAX_ADDR_RECORDS - len(out)]]
        return tuple(out)

    # ------------------------------------------------------------------ upkeep
    def expire(self, now: float) -> int:
        """Drop records past their expiry; how many went."""
        gone = [n for n, r in self._records.items() if r.expires <= now]
        for node_id in gone:
            del self._records[node_id]
        if gone:
            self.revision += 1
        return len(gone)

    def prune(self, is_member: Callable[[str], bool]) -> int:
        """Drop the records of nodes that are no longer members (a new manifest)."""
        gone = [n for n in self._records if not is_member(n)]
        for node_id in gone:
            del self._records[node_id]
        if gone:
            self.revision += 1
        return len(gone)

    def restore(self, envelopes: Iterable[SignedEnvelope], own_seq: int, now: float,
                is_member: Callable[[str], bool]) -> int:
        """Records read back from the state directory, verified like any received ones (the
        file is not trusted more than a peer); ``own_seq`` is the seq of our last record, so
        the next one is newer. Returns how many were taken."""
        taken = 0
        for envelope in envelopes:
            try:
                record = verify_record(envelope, self.fleet_id, now)
            except ProtocolError:
                continue
            if is_member(record.node_id) and self.offer(record) is not None:
                taken += 1
        # Our old record is not handed on (its addresses may be gone): only its seq stays,
        # so the next one signed is newer even if the clock went back.
        self._floor = max(self._floor, own_seq)
        return taken

    @property
    def own_seq(self) -> int:
        """The highest seq of ours known (the next record's must be higher)."""
        return max(self.own.seq if self.own else 0, self._floor)
