"""What the daemon tells its operator about its peers and its own standing, in the log.

Owns the wording and the rate of these lines: node ids shortened one way (``…`` and the last
6 characters, as ``peerd status`` shows them), plurals, one "connected to …/disconnected from
…" line per member connection with its address, and the membership advice ("not admitted to
fleet …: ask the admin to run 'peerd fleet admit <node id>'"), said once per change rather
than every gossip sweep. It decides nothing: who is a member is the manifest's (the daemon
passes the verdicts in), and it must not touch the transport, the node state or files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from peerd.control.status import MEMBER, membership_advice

# The daemon's records: an operator filters `journalctl` by one logger name.
log = logging.getLogger("peerd.daemon.daemon")

#: Shown where a connection's address could not be read (a connection torn at once).
UNKNOWN_ADDRESS = "an unknown address"


def short_id(node_id: str) -> str:
    """A node id as logs and ``peerd status`` show it: ``…`` and its last 6 characters (every
    Ed25519 peer id starts with "12D3KooW"; the tail tells nodes apart)."""
    return "…" + node_id[-6:]


def plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


class ConnectionLog:
    """One line when a member connects and one when its last connection closes.

    Strangers' connections are closed right after the handshake and outsiders could flood
    the log with them: debug lines only. Holds one address per member connected now
    (bounded by the manifest's members)."""

    def __init__(self, is_member: Callable[[str], bool]) -> None:
        self._is_member = is_member
        self._addresses: dict[str, str] = {}

    def connected(self, peer_id: str, address: str | None) -> None:
        if not self._is_member(peer_id):
            log.debug("connection from non-member %s at %s", short_id(peer_id), address)
            return
        if peer_id in self._addresses:  # a second connection (both dialled): one line
            log.debug("another connection with %s at %s", short_id(peer_id), address)
            return
        self._addresses[peer_id] = address or UNKNOWN_ADDRESS
        log.info("connected to %s at %s", short_id(peer_id), self._addresses[peer_id])

    def disconnected(self, peer_id: str, *, still_connected: bool) -> None:
        if still_connected:
            return  # another connection with it is still open
        address = self._addresses.pop(peer_id, None)
        if address is not None:  # members only, as the connect line
            log.info("disconnected from %s at %s", short_id(peer_id), address)


class Membership:
    """This node's own standing in the fleet, and the advice when it is not a member.

    Its own signed manifest judges first; a node without one (the placeholder) learns that
    it is not admitted only from a peer's refusal (``refused_as``, kept until a session
    ends cleanly)."""

    def __init__(self, fleet: str, node_id: str) -> None:
        self.fleet, self.node_id = fleet, node_id
        self.refused_as: str | None = None
        self._told: str | None = None

    def verdict(self, *, own_refusal: str | None, signed: bool) -> str:
        """"member", or why not (not_member, revoked, expired), or "unknown" while the node
        holds no signed manifest and no peer has refused it. ``own_refusal``: its manifest's
        verdict on itself (None: listed and active)."""
        if signed and own_refusal is not None:
            return own_refusal
        if self.refused_as is not None:
            return self.refused_as
        return MEMBER if signed else "unknown"

    def tell(self, membership: str, peer_id: str | None = None) -> None:
        """Log the advice when the membership changed (a refused node would otherwise
        repeat it every gossip sweep)."""
        if membership == self._told:
            return
        self._told = membership
        advice = membership_advice(self.fleet, self.node_id, membership)
        if advice is None:
            return
        by = (f" (refused by {short_id(peer_id)})"
              if peer_id is not None and self.refused_as == membership else "")
        log.warning("%s%s", advice, by)
