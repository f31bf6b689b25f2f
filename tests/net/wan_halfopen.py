"""The two ends of an idle TCP connection across a site's NAT, for
tests/net/test_wan_halfopen_netns.py, run inside namespaces with ``ip netns exec``:

- ``hold PORT``: accepts one connection, sends ``hi``, prints ``accepted``; on the stdin line
  ``close`` closes it (its FIN, and any later RST, reach the NAT'd end only if the router
  still maps the connection) and prints ``closed``.
- ``wait HOST PORT``: connects with the socket options every libp2p connection of peerd gets
  (peerd.net.mends.tune_socket: keepalive, TCP_USER_TIMEOUT), reads ``hi``, prints ``ready``,
  then waits, sending nothing, as a gossip responder waits for its peer's next frame; prints
  how it ended (``eof``, ``reset``, ``timeout``) and the seconds from the stdin line ``t0``
  (sent by the test when it closed the other end) to the end.
"""

from __future__ import annotations

import socket
import sys
import threading
import time

from peerd.net.mends import tune_socket

#: The waiting end gives up after this: beyond any keepalive or user timeout peerd sets.
WAIT_S = 40.0


def hold(port: int) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    print("listening", flush=True)
    conn, _ = srv.accept()
    conn.sendall(b"hi\n")
    print("accepted", flush=True)
    for line in sys.stdin:
        if line.strip() == "close":
            conn.close()
            print("closed", flush=True)
            return


def wait(host: str, port: int) -> None:
    s = socket.create_connection((host, port), timeout=5)
    tune_socket(s)
    assert s.recv(3) == b"hi\n"
    s.settimeout(WAIT_S)
    print("ready", flush=True)
    started: list[float] = []

    def mark() -> None:
        for line in sys.stdin:
            if line.strip() == "t0":
                started.append(time.monotonic())

    threading.Thread(target=mark, daemon=True).start()
    try:
        how = "eof" if s.recv(1) == b"" else "data"
    except ConnectionResetError:
        how = "reset"
    except TimeoutError:
        how = "timeout"
    except OSError as exc:  # ETIMEDOUT from TCP_USER_TIMEOUT, EHOSTUNREACH...
        how = f"error:{exc.errno}"
    end = time.monotonic()
    print(how, f"{end - started[0]:.2f}" if started else "nan", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "hold":
        hold(int(sys.argv[2]))
    else:
        wait(sys.argv[2], int(sys.argv[3]))
