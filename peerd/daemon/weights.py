"""``[learning] mode = "weights"``: the daemon's weight-mode round (blend → K proximal steps →
publish) and what it carries from one round to the next.

Wiring only, like :mod:`peerd.daemon.knowledge` (its knowledge-mode twin): the decisions are
:func:`peerd.core.round` 's, run with in-place, low-memory operations by
:func:`peerd.learn.trainer.run_round`; the entry is signed into its state file by
:mod:`peerd.store.persist`. :mod:`peerd.daemon.daemon` builds a :class:`WeightsMode` at
start-up and calls :meth:`WeightsMode.round` every round; it owns the gossip wake-up and the
metrics endpoint. This module must not parse wire bytes or touch files itself.
"""

from __future__ import annotations

import hashlib
import logging
import math
from typing import Protocol

import trio

from peerd.core.entry import CacheItem
from peerd.core.round import parse_blend
from peerd.daemon import sdnotify
from peerd.daemon.host import ModeHost, expire_stale
from peerd.daemon.memory import release_freed_memory
from peerd.daemon.normwatch import NormWatch
from peerd.daemon.notices import plural
from peerd.learn.trainer import LocalTraining, RoundInput, RoundOutput, drift_to, run_round
from peerd.node.peers import PeerTable
from peerd.store import persist, spool
from peerd.store.statedir import Counters

log = logging.getLogger(__name__)


class Daemon(ModeHost, Protocol):
    """What weight mode uses of :class:`peerd.daemon.daemon.Daemon` (see
    :mod:`peerd.daemon.host`)."""

    peers: PeerTable


class WeightsMode:
    """The weight-mode half of one daemon: update norms and the local policy's state across
    rounds, and whether the model is the published entry bit for bit."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        cfg = daemon.cfg
        self.norms = NormWatch(cfg.validation.update_norm_policy)
        self.local = LocalTraining.of(cfg.learning)  # FedBSS warm-up state across rounds
        #: The model equals the published entry's tensors bit for bit (see RoundInput).
        self.model_is_published = False

    async def round(self) -> bool:
        """One round; True when it published a new entry (the daemon wakes the gossip)."""
        d = self.daemon
        node, learning, state = d.node, d.cfg.learning, d.state
        now = d.now()
        expire_stale(d, node, now)
        clock = node.clock(now)
        seed = int.from_bytes(hashlib.sha256(f"{node.id}/{node.round}".encode()).digest()[:8])
        # The round gets metadata plus a list of entries it consumes (see RoundInput.peers):
        # nothing here keeps a reference that would pin a superseded entry during training.
        meta_only = tuple(CacheItem(i.meta, i.received_from, i.received_at, verified=i.verified)
                          for i in node.cache)
        # Peers age our entry by its created_at: past max_silence the round republishes it
        # even below ε (core.drift.should_publish), so a quiet node never expires at peers.
        silent_for = math.inf if node.own is None else now - node.own.entry.meta.created_at
        inp = RoundInput(own_id=node.id, cache=meta_only, peers=node.blend_inputs(), clock=clock,
                         policy=learning.alpha_policy, steps=learning.local_steps,
                         batch_size=learning.batch_size, lr=learning.lr, rho=learning.rho,
                         seed=seed, epsilon=learning.epsilon, silent_for_s=silent_for,
                         max_silence_s=learning.silence_limit_s,
                         published=d.metrics.published_params,
                         model_is_published=self.model_is_published,
                         keep_anchor=lambda x: spool.spill(x, state.blobs),
                         blend=parse_blend(learning.blend),
                         norm_policy=self.norms.policy, norm_history=self.norms.history,
                         local=self.local)
        self.model_is_published = False  # the round trains the model in place
        # The core round (peerd.core.round) decides α, x̄ and whether to publish; the daemon
        # only carries the decision out (sign, persist, announce).
        out: RoundOutput = await trio.to_thread.run_sync(run_round, d.model, d.task, inp)
        m = d.metrics
        m.examples, m.train_loss, m.val_loss = out.examples, out.train_loss, out.val_loss
        m.val_accuracy, m.alpha, m.weights = out.val_accuracy, out.alpha, out.weights
        # Drifts to what the cache holds now (entries may have been replaced meanwhile), for
        # the status; off the event loop, since each reads a whole model.
        cached = node.blend_inputs()

        def drifts() -> dict[str, float]:
            try:
                return drift_to(out.params, cached)
            finally:
                node.release()  # the round and the drifts read every entry; let them go

        m.drift = await trio.to_thread.run_sync(drifts)
        self.norms.record(out, node, state, learning.blend)
        node.round += 1
        if out.publish:
            if learning.epsilon > 0 and out.moved <= learning.epsilon:
                log.info("republishing: %.0f s since the last entry (drift %.3g <= epsilon)",
                         silent_for, out.moved)
            # Never reuse a version: skip past anything of ours a peer relayed back, and
            # persist the counter before the entry can leave this process.
            version = max(m.version, node.own_max_version_seen) + 1
            state.save_counters(Counters(round=node.round, version=version))
            # Signed straight into its state file (persist.publish_own): no payload copy.
            held = await trio.to_thread.run_sync(
                lambda: persist.publish_own(state, node, params=out.params,
                                            version=version, created_at=d.now(),
                                            num_examples=out.examples))
            node.set_own(held.entry, held.message, held.frame)
            # The entry's tensors: the last published model is kept once (on disk when
            # mapped), not a second time in memory.
            m.version, m.published_params = version, held.entry.params
            self.model_is_published = True  # signed from the model's own tensors
        else:
            state.save_counters(Counters(round=node.round, version=m.version))
        m.round = node.round
        d.participation.weights_round(round_no=node.round, out=out, own_id=node.id,
                                      cache=meta_only, clock=clock, drift=m.drift,
                                      published=m.version if out.publish else None)
        acc = "-" if m.val_accuracy is None else f"{m.val_accuracy:.3f}"
        log.info("round %d: version %d, loss %.4f, val acc %s, cache %d", node.round, m.version,
                 m.train_loss, acc, len(node.cache))
        release_freed_memory()
        sdnotify.status(f"round {node.round}, version {m.version}, {len(node.cache)} cached, "
                        f"{plural(len(d.peers), 'peer', 'peers')}")
        return out.publish
