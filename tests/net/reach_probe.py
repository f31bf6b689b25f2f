"""One reachability check from inside a namespace (tests/net/test_autonat_netns.py): a peerd
transport on 0.0.0.0:PORT asks RELAY (``…/p2p/ID``) for a dial-back and prints one JSON line,
``{"verdict": …, "reached": …, "not_reached": …, "error": …}``. No daemon: no torch import."""

from __future__ import annotations

import json
import os
import sys

import trio

from peerd.net.reachability import Reachability
from peerd.net.transport import Stream, TransportConfig, open_transport


async def _nothing(stream: Stream) -> None:
    await stream.reset()


async def main(relay: str, port: int) -> None:
    cfg = TransportConfig(listen_host="0.0.0.0", listen_port=port)  # dialled back from outside
    async with open_transport(os.urandom(32), _nothing, cfg) as t:
        reach = Reachability(t, [relay])
        await reach.check()
        s = reach.snapshot()
        print(json.dumps({"verdict": str(s.verdict), "reached": s.reached,
                          "not_reached": s.not_reached, "error": s.last_error}), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
