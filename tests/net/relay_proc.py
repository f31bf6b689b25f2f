"""The stand-in relay (tests/net/relay_fixture.py) as a process, for the namespace WAN:
``python -m tests.net.relay_proc SEED_HEX PORT`` listens on 0.0.0.0:PORT with the key of
that seed, prints ``READY <multiaddr>`` once the hop and the rendezvous point run, and
serves until it is terminated."""

from __future__ import annotations

import sys

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.net.relay_fixture import relay


async def main(seed: bytes, port: int) -> None:
    key = Ed25519PrivateKey.from_private_bytes(seed)
    # All addresses: it runs alone in its namespace on the public segment.
    async with relay(key=key, host="0.0.0.0", port=port) as r:
        print(f"READY {r.transport.peer_id} {r.transport.listen_addrs}", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, bytes.fromhex(sys.argv[1]), int(sys.argv[2]))
