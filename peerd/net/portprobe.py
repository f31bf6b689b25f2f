"""The port probe before a host listens: py-libp2p's listener sets SO_REUSEPORT, so a taken
port would not fail its bind.

Apart from :mod:`peerd.net.mends` (which imports libp2p) so that `peerd run` can check its
listen address before it loads libp2p or torch: a start-up failure is then reported in a
fraction of a second (:mod:`peerd.daemon.preflight`).
"""

from __future__ import annotations

import socket

from peerd.net.framing import TransportError


def check_port_free(host: str, port: int) -> None:
    """Fail if another socket listens on ``host:port``.

    py-libp2p listens with SO_REUSEPORT (for hole punching), so a second daemon on the same
    port would not fail: the kernel would split inbound connections between the two. A
    probe bound *without* SO_REUSEPORT gets EADDRINUSE while any listener holds the port.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # REUSEADDR only: TIME_WAIT leftovers from our own previous run are no conflict.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise TransportError(f"cannot listen on {host}:{port}: {e.strerror}") from e
