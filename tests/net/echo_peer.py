"""One libp2p host on 127.0.0.1 in its own process that echoes every frame back (up to
:data:`LIMIT` bytes), with peerd's throughput mends (``peerd.net.mends_throughput``) on or,
given ``--unmended``, off: the other side of tests/net/test_mends_throughput.py's interop
tests, so a mended host is checked against py-libp2p's own data path and back.

Prints ``PEER_ID PORT`` once listening; ends when stdin closes.
"""

from __future__ import annotations

import argparse
import sys

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.net import mends_throughput
from peerd.net.transport import (
    Stream,
    StreamClosedError,
    TransportConfig,
    open_transport,
    read_frame,
    write_frame,
)

#: Largest frame echoed (the tests send a few MB).
LIMIT = 16 * 1024 * 1024


async def _echo(stream: Stream) -> None:
    while True:
        try:
            data = await read_frame(stream, LIMIT)
        except StreamClosedError:
            return
        await write_frame(stream, data)


async def main() -> None:
    config = TransportConfig(listen_host="127.0.0.1")
    async with open_transport(Ed25519PrivateKey.generate(), _echo, config) as t:
        print(t.peer_id, t.port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--unmended", action="store_true")
    if ap.parse_args().unmended:
        mends_throughput.set_enabled(False)
    trio.run(main)
