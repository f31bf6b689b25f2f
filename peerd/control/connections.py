"""The control socket's open connections, capped, with the oldest idle one evicted first.

A local process that opens connections and says nothing must not keep a genuine client
out: :class:`Connections` caps what the server holds open (a file descriptor
each) and, at the cap, closes the oldest connection that owes us its request line (or only
sends an oversize request we are dropping) to make room. Connections the server still owes
an answer are never evicted. This module only keeps the table; the server
(:mod:`peerd.control.server`) decides when a connection is evictable and owns the socket.
"""

from __future__ import annotations

import trio


class Connection:
    """One open connection: the scope that evicting it cancels (its handler then closes it)."""

    __slots__ = ("scope",)

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope


class Connections:
    """Open connections, at most ``cap``; the oldest evictable one makes room for a new one."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._open: set[Connection] = set()
        self._evictable: dict[Connection, None] = {}  # in arrival order

    def admit(self, conn: Connection) -> bool:
        """Register ``conn`` (evictable); False at the cap when nothing can be evicted."""
        if len(self._open) >= self._cap:
            if not self._evictable:
                return False
            oldest = next(iter(self._evictable))
            self.remove(oldest)  # counted out now, not when its handler next runs
            oldest.scope.cancel()
        self._open.add(conn)
        self._evictable[conn] = None
        return True

    def evictable(self, conn: Connection, yes: bool) -> None:
        """Mark ``conn`` as one that may be evicted (``yes``, it becomes the youngest) or not."""
        if yes and conn in self._open:
            self._evictable[conn] = None
        else:
            self._evictable.pop(conn, None)

    def remove(self, conn: Connection) -> None:
        self._open.discard(conn)
        self._evictable.pop(conn, None)

    def __len__(self) -> int:
        return len(self._open)
