"""A userspace delay line for the namespace WAN's uplinks (tests/net/wan.py), for kernels
without ``sch_netem``: two TAP devices and one process that copies Ethernet frames between
them, each frame held ``delay_ms`` before it goes out the other side.

    ip netns exec ROUTER_NS python delaywire.py DELAY_MS DEV_A DEV_B NS_B

It runs in the router's namespace (never the root one), creates the TAP devices ``DEV_A``
and ``DEV_B`` there, moves ``DEV_B`` into the namespace ``NS_B`` (the public switch; a TAP's
file descriptor stays attached when its device moves), prints ``ready`` and copies until
its stdin closes (wan() closes it on exit, and so does the test process's death), or it is
killed; the devices go with its descriptors. The caller addresses, bridges and shapes the
devices (rate: tbf on both, as on a veth; loss: the router's iptables rule).

One thread, one loop: ``select`` on both descriptors with a timeout to the earliest frame
due; what is readable is read (non-blocking, a batch at a time) and stamped with its due
time; what is due is written. A constant delay keeps each direction first in, first out, so
a deque per direction is the whole schedule. Writes do not block (a TAP write hands the
frame to the kernel's receive path); a frame the kernel refuses is lost, as on a wire.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import struct
import subprocess
import sys
import threading
import time
from collections import deque

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
#: Frames read from one side per loop turn, so a flood one way cannot starve the other.
BATCH = 64
#: Frames held per direction at most (a backlog past this is dropped, as a full queue is):
#: 20 Mbit/s for 40 ms is ~70 full frames; 1 Gbit/s for 40 ms ~3,300.
MAX_HELD = 10_000
FRAME_MAX = 65536


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def copy(delay_s: float, fds: tuple[int, int]) -> None:
    held: dict[int, deque[tuple[float, bytes]]] = {fd: deque() for fd in fds}
    other = {fds[0]: fds[1], fds[1]: fds[0]}
    while True:
        heads = [q[0][0] for q in held.values() if q]
        timeout = max(0.0, min(heads) - time.monotonic()) if heads else None
        readable, _, _ = select.select(fds, [], [], timeout)
        now = time.monotonic()
        for fd in readable:
            q = held[other[fd]]  # frames read from fd leave by the other side
            for _ in range(BATCH):
                try:
                    frame = os.read(fd, FRAME_MAX)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:  # EIO while a device is down (moved, not yet up)
                    break
                if len(q) < MAX_HELD:
                    q.append((now + delay_s, frame))
        now = time.monotonic()
        for out, q in held.items():
            while q and q[0][0] <= now:
                # Refused (device down, queue full): lost, as on a wire.
                with contextlib.suppress(OSError):
                    os.write(out, q.popleft()[1])


def _exit_on_eof() -> None:
    sys.stdin.buffer.read()
    os._exit(0)


def main() -> None:
    delay_ms, dev_a, dev_b, ns_b = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    fds = (open_tap(dev_a), open_tap(dev_b))
    subprocess.run(["ip", "link", "set", dev_b, "netns", ns_b], check=True, timeout=10)
    threading.Thread(target=_exit_on_eof, daemon=True).start()
    print("ready", flush=True)
    copy(delay_ms / 1000, fds)


if __name__ == "__main__":
    main()
