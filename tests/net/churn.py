"""Stranger churn: many fresh libp2p identities, each dialling a target once (tests and the
churn benchmark).

Each stranger is a whole py-libp2p host of its own (peerd's transport: Noise, Yamux,
identify served and requested, as any libp2p peer runs them), with a fresh Ed25519 key. It
connects, says Hello as a would-be member of the target's fleet, reads the target's answer
(a Hello and a ``not_member`` error, or a closed connection when no probation slot was free),
and leaves. That is the attack of issue 24: about 1,000 of them used to stop a daemon.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.net.gossip import CAPABILITIES
from peerd.net.transport import Stream, TransportConfig, TransportError, open_transport
from peerd.protocol import messages as msg
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import node_id_of
from peerd.protocol.limits import MAX_CONTROL_FRAME_LEN

#: One stranger's whole visit (host start, dial, handshake, session, close) on loopback.
VISIT_TIMEOUT_S = 30.0


@dataclass
class Churn:
    """What the strangers saw: outcome -> count, and how long the churn took."""

    outcomes: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def visits(self) -> int:
        return sum(self.outcomes.values())


async def _refuse(stream: Stream) -> None:
    return  # nobody is served by a stranger


async def _visit(fleet_id: bytes, target_id: str, target_addr: str) -> str:
    key = Ed25519PrivateKey.generate()
    cfg = TransportConfig(listen_host="127.0.0.1", listen_port=0)
    try:
        with trio.fail_after(VISIT_TIMEOUT_S):
            async with open_transport(key, _refuse, cfg) as host, \
                    host.open_stream(target_id, [target_addr]) as stream:
                await stream.send([msg.Hello(fleet_id, node_id_of(key), 0,
                                             CAPABILITIES).head()])
                outcome = "no answer"
                for _ in range(2):  # the target's Hello, then its error
                    reply = msg.decode_frame(await stream.recv(MAX_CONTROL_FRAME_LEN))
                    if isinstance(reply, msg.Error):
                        return f"error {reply.code}"
                    outcome = f"{reply.TYPE} only"
                return outcome
    except Exception as e:  # sorted below; anything else is re-raised
        leaf: BaseException = e
        while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
            leaf = leaf.exceptions[0]  # the transport's nursery wraps what the body raised
        if isinstance(leaf, trio.TooSlowError):
            return "timed out"
        if isinstance(leaf, TransportError | ProtocolError):
            return f"closed ({type(leaf).__name__})"
        raise


async def churn(fleet_id: bytes, target_id: str, target_addr: str, count: int, *,
                concurrency: int = 8,
                progress: Callable[[int], None] | None = None) -> Churn:
    """``count`` strangers visit the target, ``concurrency`` at a time."""
    out = Churn()
    started = time.monotonic()
    left = count

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            out.outcomes[await _visit(fleet_id, target_id, target_addr)] += 1
            if progress is not None:
                progress(out.visits)

    async with trio.open_nursery() as nursery:
        for _ in range(min(concurrency, count)):
            nursery.start_soon(worker)
    out.seconds = time.monotonic() - started
    return out


def churn_in_thread(fleet_id: bytes, target_id: str, target_addr: str, count: int,
                    **kwargs: object) -> Churn:
    """:func:`churn` from synchronous code (its own trio loop; this thread waits)."""
    result: list[Churn] = []

    async def main() -> None:
        result.append(await churn(fleet_id, target_id, target_addr, count,
                                  **kwargs))  # type: ignore[arg-type]

    trio.run(main)
    return result[0]
