"""Issue 12 item 4: the ledger is touched on the event-loop thread only.

Before, :func:`peerd.node.state.verify` ran in a worker thread with the live ledger: its
check flagged an equivocating origin (``flagged.add``) while the loop could be iterating the
set for the status ("Set changed size during iteration"). Here the ledger refuses any access
from a thread other than the one that runs the sessions, and real sessions verify entries in
worker threads.
"""

from __future__ import annotations

import threading
from typing import Any

import trio

from peerd.net.gossip import SessionResult, run_session
from peerd.node.state import NodeState
from peerd.protocol.ledger import OriginLedger
from tests.net.test_gossip import CTX, A, B, MemoryIO, pipe, publish, session, signed_node
from tests.net.test_gossip_regressions import WantHookIO


class LoopOnlyLedger(OriginLedger):
    """An OriginLedger that fails loudly when touched from any thread but its owner's."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("__"):
            owner = object.__getattribute__(self, "_thread")
            if threading.get_ident() != owner:
                raise AssertionError(f"ledger.{name} touched from a worker thread")
        return object.__getattribute__(self, name)


def guarded(n: NodeState) -> LoopOnlyLedger:
    ledger = LoopOnlyLedger(owner=n.id)
    object.__setattr__(ledger, "_thread", threading.get_ident())  # trio.run runs here
    n.ledger = ledger
    return ledger


def test_entries_are_verified_in_workers_without_touching_the_ledger() -> None:
    a, b = signed_node(A, 1, A, B), signed_node(B, 1, A, B)
    guarded(a)
    guarded(b)
    publish(a, 3)
    publish(b, 5)
    ra, rb = session(a, b)
    assert (ra.received, rb.received) == (1, 1)
    assert b.ledger.held[a.id].version == 3
    assert a.ledger.held[b.id].version == 5


def test_an_equivocation_proven_in_the_worker_is_flagged_on_the_loop_thread() -> None:
    # a asks b for b@5; before the entry arrives, a's ledger learns another b@5 (as another
    # session would). The worker proves the equivocation on its snapshot; the flag is set
    # on the loop thread, where the status reads the flags.
    a, b = signed_node(A, 1, A, B), signed_node(B, 1, A, B)
    ledger = guarded(a)
    publish(b, 5)
    results: dict[str, SessionResult] = {}

    async def main() -> None:
        io_a, io_b = pipe()
        hooked = WantHookIO(io_a, lambda: ledger.record(b.id, 5, "cd" * 32))

        async def side(name: str, io: MemoryIO, n: NodeState, peer: str, init: bool) -> None:
            results[name] = await run_session(io, n, CTX, peer_id=peer, initiator=init)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(side, "a", hooked, a, b.id, True)
                nursery.start_soon(side, "b", io_b, b, a.id, False)

    trio.run(main)
    assert results["a"].refused == {"equivocation": 1}
    assert ledger.flagged == {b.id}
    assert a.rejected["equivocation"] == 1
