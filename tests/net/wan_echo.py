"""Tiny TCP/UDP probes for tests/net/test_wan_netns.py, run inside namespaces with
``ip netns exec``: what address does the other side see?

- ``serve PORT``: TCP and UDP on PORT; answers every connection or datagram with the
  ``IP:PORT`` it came from (TCP: the line, then close). Prints ``ready`` once bound.
  TCP on PORT+1 is a sink: it reads to EOF and answers the byte count.
- ``tcp HOST PORT``: connects (3 s), prints the answer, or ``error: ...`` and exits 1.
- ``blast HOST PORT BYTES``: sends BYTES to the sink at PORT+1, prints the seconds until its
  answer came back (everything had arrived).
- ``burst HOST PORT N``: N datagrams 2 ms apart from one socket, then prints how many answers
  came back within a second of the last (each lost on the way there or back counts once).
- ``udp LOCAL_PORT``: one socket bound to LOCAL_PORT; for every stdin line ``HOST PORT`` sends
  a datagram and prints ``<answer> <rtt_ms>`` (or ``timeout``), so one flow outlives the lines.
"""

from __future__ import annotations

import select
import socket
import sys
import time


def serve(port: int) -> None:
    tcp = socket.socket()
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("0.0.0.0", port))
    tcp.listen(16)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", port))
    sink = socket.socket()
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sink.bind(("0.0.0.0", port + 1))
    sink.listen(4)
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([tcp, udp, sink], [], [])
        if sink in ready:
            conn, _ = sink.accept()
            with conn:
                got = 0
                while chunk := conn.recv(65536):
                    got += len(chunk)
                conn.sendall(f"{got}\n".encode())
        if udp in ready:
            _, (ip, sport) = udp.recvfrom(2048)
            udp.sendto(f"{ip}:{sport}".encode(), (ip, sport))
        if tcp in ready:
            conn, (ip, sport) = tcp.accept()
            with conn:
                conn.sendall(f"{ip}:{sport}\n".encode())


def tcp(host: str, port: int) -> int:
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            print(s.makefile().readline().strip(), flush=True)
    except OSError as exc:
        print(f"error: {exc}", flush=True)
        return 1
    return 0


def blast(host: str, port: int, n: int) -> None:
    with socket.create_connection((host, port + 1), timeout=30) as s:
        t0 = time.monotonic()
        s.sendall(bytes(n))
        s.shutdown(socket.SHUT_WR)
        assert int(s.makefile().readline()) == n
        print(f"{time.monotonic() - t0:.3f}", flush=True)


def burst(host: str, port: int, n: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    got = 0
    for _ in range(n):
        s.sendto(b"x", (host, port))
        time.sleep(0.002)
        while select.select([s], [], [], 0)[0]:
            s.recvfrom(2048)
            got += 1
    deadline = time.monotonic() + 1.0
    while (left := deadline - time.monotonic()) > 0 and select.select([s], [], [], left)[0]:
        s.recvfrom(2048)
        got += 1
    print(got, flush=True)


def udp(local_port: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", local_port))
    s.settimeout(3)
    for line in sys.stdin:
        host, port = line.split()
        t0 = time.monotonic()
        s.sendto(b"x", (host, int(port)))
        try:
            answer, _ = s.recvfrom(2048)
        except TimeoutError:
            print("timeout", flush=True)
            continue
        print(f"{answer.decode()} {(time.monotonic() - t0) * 1000:.2f}", flush=True)


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "serve":
        serve(int(rest[0]))
    elif mode == "tcp":
        sys.exit(tcp(rest[0], int(rest[1])))
    elif mode == "blast":
        blast(rest[0], int(rest[1]), int(rest[2]))
    elif mode == "burst":
        burst(rest[0], int(rest[1]), int(rest[2]))
    else:
        udp(int(rest[0]))
