"""A minimal sd_notify(3) client: tells systemd (``Type=notify``) that the daemon is ready.

No dependency: one datagram to ``$NOTIFY_SOCKET`` (a path, or an abstract socket spelled
``@name``). Without ``$NOTIFY_SOCKET`` (run by hand, in tests) every call is a no-op.
A failing notify is logged and swallowed: systemd being away must not stop the node.
It knows nothing of the daemon's state: the caller decides what to report and when.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)

#: Longest STATUS= text sent: systemd shows one line; a huge one is a bug, not information.
MAX_STATUS_LEN = 512
#: Bound on the send: a full socket buffer (systemd hung) must not block the round loop.
SEND_TIMEOUT_S = 1.0


def notify(message: str) -> bool:
    """Send ``message`` (e.g. ``"READY=1"``); True if sent, False if not under systemd/failed."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    elif not address.startswith("/"):
        log.warning("ignoring NOTIFY_SOCKET=%r: not a path or @abstract name", address)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(SEND_TIMEOUT_S)
            sock.sendto(message.encode("utf-8"), address)
    except OSError as exc:
        log.warning("sd_notify %r failed: %s", message.split("=", 1)[0], exc)
        return False
    return True


def ready() -> bool:
    return notify("READY=1")


def status(text: str) -> bool:
    # One line only: a newline would start a second (unintended) assignment.
    line = " ".join(text.split())[:MAX_STATUS_LEN]
    return notify(f"STATUS={line}")


def stopping() -> bool:
    return notify("STOPPING=1")


def watchdog() -> bool:
    return notify("WATCHDOG=1")
