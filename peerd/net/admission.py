"""Who may hold a connection to this node: the transport's admission (mend 8, listed in
:mod:`peerd.net.mends`, wired in :mod:`peerd.net.transport`), as plain Python over trio.

Outsiders need no membership to connect (any fresh key completes the Noise handshake), so
once the handshake has authenticated a peer id, the caller's predicate decides: an admitted
peer (the daemon: an active member) keeps its connection; anyone else's is closed at once,
except that a few (:data:`~peerd.net.transport_config.MAX_PROBATION_CONNECTIONS`, one per
peer) may stay for one session: a newcomer admitted by a manifest this node has not seen
yet brings that manifest in its first session (``protocol/session.py``). When that session
ends, or after ``probation_s``, the peer must be admitted or its connection goes.

Owns the verdict (a predicate that raises refuses), the probation slots and the count of
connections refused without a session. It must not import libp2p nor touch a socket:
connections are opaque keys, and closing one is the transport's ``close`` callback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field

import trio

logger = logging.getLogger(__name__)

#: Whether an authenticated peer id may hold a connection that it opened.
AdmitPeer = Callable[[str], bool]


@dataclass(slots=True)
class Probation:
    """A connection of a peer not admitted, allowed one session."""

    peer_id: str
    done: trio.Event = field(default_factory=trio.Event)  # its first inbound stream ended
    had_session: bool = False
    #: Refused after its session: the transport lets it read the refusal and hang up
    #: (REFUSAL_LINGER_S); a stream it opens meanwhile is refused, not a second session.
    lingering: bool = False


class Admission:
    """The admission of one transport; ``admit`` None lets everyone in."""

    def __init__(self, admit: AdmitPeer | None, on_refused: Callable[[str], None] | None, *,
                 max_probation: int, probation_s: float,
                 close: Callable[[Hashable], Awaitable[None]]) -> None:
        self._admit = admit
        self._on_refused = on_refused
        self._max_probation = max_probation
        self._probation_s = probation_s
        self._close = close
        self._probation: dict[Hashable, Probation] = {}
        #: Where probation timers and closes run; set while the host runs (open_transport).
        self.tasks: trio.Nursery | None = None
        #: Connections of peers not admitted that were closed without a session.
        self.refused = 0

    @property
    def enabled(self) -> bool:
        return self._admit is not None

    def admitted(self, peer_id: str) -> bool:
        if self._admit is None:
            return True
        try:
            return self._admit(peer_id)
        except Exception:  # a buggy predicate must not take the host down: refuse
            logger.exception("admission check for %s failed", peer_id)
            return False

    def probation_count(self) -> int:
        """Connections of peers not (yet) admitted that are held for one session now."""
        return len(self._probation)

    def screen(self, conn: Hashable, peer_id: str) -> bool:
        """May ``conn`` of ``peer_id`` be used? An admitted peer's may; otherwise it takes a
        probation slot if one is free and the peer holds none, or it is closed now.
        Synchronous: no other task runs between the check and the decision."""
        if self.admitted(peer_id):
            return True
        if conn in self._probation:
            return not self._probation[conn].lingering
        if (len(self._probation) < self._max_probation and self.tasks is not None
                and all(p.peer_id != peer_id for p in self._probation.values())):
            probation = self._probation[conn] = Probation(peer_id)
            self.tasks.start_soon(self._end_probation, conn, probation)
            return True
        self._refuse(conn, peer_id, counted=True)
        return False

    def session_started(self, conn: Hashable) -> Probation | None:
        """An inbound stream on ``conn`` (screened) is served: its probation, if any."""
        probation = self._probation.get(conn)
        if probation is not None:
            probation.had_session = True
        return probation

    def lingers(self, probation: Probation | None) -> bool:
        """Its session is over and the peer still not admitted: its connection goes, but
        only once the peer has read the refusal (the transport's linger, issue 27). From
        now on a stream it opens is refused, not a second session."""
        if probation is None or self.admitted(probation.peer_id):
            return False
        probation.lingering = True
        return True

    @staticmethod
    def session_ended(probation: Probation | None) -> None:
        """That stream's session is over: the peer is admitted by now, or its connection
        goes (without waiting for the rest of the probation)."""
        if probation is not None:
            probation.done.set()

    async def _end_probation(self, conn: Hashable, probation: Probation) -> None:
        with trio.move_on_after(self._probation_s):
            await probation.done.wait()
        self._probation.pop(conn, None)
        if not self.admitted(probation.peer_id):
            # A session that refused it was counted by the gossip layer; none opened is
            # counted here.
            self._refuse(conn, probation.peer_id, counted=not probation.had_session)

    def _refuse(self, conn: Hashable, peer_id: str, *, counted: bool) -> None:
        if counted:
            self.refused += 1
            logger.debug("closing the connection of %s: not admitted", peer_id)
            if self._on_refused is not None:
                try:
                    self._on_refused(peer_id)
                except Exception:
                    logger.exception("refused-peer callback failed")
        if self.tasks is not None:
            self.tasks.start_soon(self._close, conn)
