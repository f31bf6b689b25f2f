"""Which entries are being downloaded right now, so that no entry is fetched twice at once.

A new version spreads by gossip: soon after it appears, several peers offer it in the same few
seconds, each in its own session. Without a claim each of those sessions would ask for it,
and a 44 MB model would cross the link once per offering peer, all but one copy thrown away
as a duplicate after verification. So a session's Want is filtered here: an (origin, version)
another running session has already asked for is left out, and this session claims the rest.
Claims last until their session ends (received, refused, torn or timed out alike); an entry
that did not arrive is asked for again in the next session that offers it, so a dying peer
delays a version by one session at most and never loses it.

Pure bookkeeping: no I/O, no clock, no trio; the session shell (``peerd.net.gossip``) calls
it from the event loop thread only.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

Key = tuple[str, int]  # (origin, version)


class InFlight:
    """Claims on (origin, version) keys, each held by one session token."""

    def __init__(self) -> None:
        self._owner: dict[Key, Hashable] = {}
        self._by_session: dict[Hashable, set[Key]] = {}
        #: Keys left out of a Want because another session was fetching them (a status
        #: counter: the duplicate transfers this saved).
        self.deduplicated = 0

    def __len__(self) -> int:
        return len(self._owner)

    def claim(self, session: Hashable, keys: Iterable[Key]) -> tuple[Key, ...]:
        """The keys ``session`` may ask for, in the given order: those no other session
        holds. It claims them (its own earlier claims stay valid)."""
        mine = self._by_session.setdefault(session, set())
        granted = []
        for key in keys:
            owner = self._owner.get(key)
            if owner is not None and owner != session:
                self.deduplicated += 1
                continue
            self._owner[key] = session
            mine.add(key)
            granted.append(key)
        if not mine:
            del self._by_session[session]
        return tuple(granted)

    def release(self, session: Hashable) -> None:
        """The session ended: whatever it did not receive may be fetched elsewhere."""
        for key in self._by_session.pop(session, ()):
            if self._owner.get(key) == session:
                del self._owner[key]

    def holder(self, key: Key) -> Hashable | None:
        return self._owner.get(key)
