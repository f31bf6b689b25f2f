"""Real libp2p hosts on loopback for the transport tests, in one trio process: a test body
run under a deadline, an echo handler, and a host that is closed when its block ends.

Shared by tests/net/test_transport_host.py and tests/net/test_transport_admission.py. It
must not bind anything but 127.0.0.1, nor run discovery (mDNS stays in namespaces).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.net.transport import (
    Stream,
    StreamClosedError,
    Transport,
    TransportConfig,
    open_transport,
    read_frame,
    write_frame,
)

LOOPBACK = TransportConfig(listen_host="127.0.0.1")
#: Every test body runs under a deadline (this one unless told), so a hang fails instead of
#: stalling CI.
TEST_DEADLINE_S = 30.0


def run(fn: Callable[[], Awaitable[None]], deadline_s: float = TEST_DEADLINE_S) -> None:
    async def main() -> None:
        with trio.fail_after(deadline_s):
            await fn()

    trio.run(main)


async def echo(stream: Stream) -> None:
    """Echo frames until the remote half-closes."""
    while True:
        try:
            data = await read_frame(stream, 1 << 20)
        except StreamClosedError:
            return
        await write_frame(stream, data)


@asynccontextmanager
async def host(
    handler: Callable[[Stream], Awaitable[None]] = echo,
    config: TransportConfig = LOOPBACK,
    key: Ed25519PrivateKey | None = None,
) -> AsyncIterator[Transport]:
    async with open_transport(key or Ed25519PrivateKey.generate(), handler, config) as t:
        yield t
