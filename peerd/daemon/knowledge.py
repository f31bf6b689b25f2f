"""``[learning] mode = "knowledge"``: the daemon's knowledge round and what it settles once.

Wiring only, like :mod:`peerd.daemon.daemon` (which calls :func:`attach` at start-up and
:meth:`KnowledgeMode.round` every round): the gossip state is
:class:`peerd.node.knowstate.KnowledgeState`, the training
:func:`peerd.learn.knowround.run_knowledge_round` (the core round with the ``none`` blend and
distillation), the wire format :mod:`peerd.protocol.knowledge`.

Each round: drop stale entries; join the cached knowledge with its keys; distil K steps
towards the teachers of the local samples; publish the keys entry when it is new or changed
(normally once), then a knowledge entry with this round's logits, each under the next version
of the node's one version sequence; save the model as the learner file
(peerd.learn.learnerstate), which the next start restores. Sessions carry them like models:
nothing else changes.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Protocol

import numpy as np
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.core.distill import Distillation
from peerd.daemon import sdnotify
from peerd.daemon.host import ModeHost, expire_stale
from peerd.daemon.memory import release_freed_memory
from peerd.learn import learnerstate
from peerd.learn.knowcache import KnowledgeBatch, KnowledgeCache
from peerd.learn.knowround import (
    KnowledgeRoundInput,
    KnowledgeRoundOutput,
    encode_keys,
    knowledge_schema,
    run_knowledge_round,
)
from peerd.node.knowstate import KnowledgeState, sign_own_keys, sign_own_knowledge
from peerd.protocol.limits import MAX_KNOWLEDGE_SAMPLES
from peerd.store.statedir import Counters

log = logging.getLogger(__name__)


class Daemon(ModeHost, Protocol):
    """What knowledge mode uses of :class:`peerd.daemon.daemon.Daemon` (see
    :mod:`peerd.daemon.host`)."""

    key: Ed25519PrivateKey


class KnowledgeMode:
    """The knowledge half of one daemon: its node state, sample keys and knowledge cache."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        cfg = daemon.cfg
        learning = cfg.learning
        self.data = daemon.task.data()
        self.rows = min(len(self.data.y_train), MAX_KNOWLEDGE_SAMPLES)
        if self.rows < 1:
            raise ValueError("knowledge mode needs at least one local training sample")
        # The knowledge schema: key width, classes and the encoder; never the model.
        self.schema, self.encoder = knowledge_schema(
            cfg.fleet.fleet_id, daemon.task, daemon.model, key_dim=learning.knowledge.key_dim,
            max_samples=MAX_KNOWLEDGE_SAMPLES)
        self.node = KnowledgeState.from_node(daemon.node, self.schema,
                                             sample_budget=learning.sample_capacity)
        self.keys = encode_keys(self.encoder, self.data.X_train)
        self.labels = self.data.y_train.numpy().astype(np.int64)
        self.cache = KnowledgeCache(learning.knowledge.key_dim, self.schema.num_classes)
        self.policy = Distillation(beta=learning.knowledge.beta,
                                   temperature=learning.knowledge.temperature,
                                   r=learning.knowledge.neighbours)
        # What the model learned survives a restart: the learner file, saved every round.
        self.learner = learnerstate.KnowledgeLearner(daemon.model, task=cfg.task.name,
                                                     model_name=cfg.task.model)
        learnerstate.restore(daemon.state, self.learner)

    async def round(self) -> None:
        d, node, learning = self.daemon, self.node, self.daemon.cfg.learning
        now = d.now()
        expire_stale(d, node, now)
        peers = [KnowledgeBatch(r.origin, r.version, r.created_at, r.keys, r.labels, r.logits)
                 for r in node.batches()]
        seed = int.from_bytes(hashlib.sha256(f"{node.id}/{node.round}".encode()).digest()[:8])
        inp = KnowledgeRoundInput(own_id=node.id, clock=node.clock(now), peers=peers,
                                  policy=self.policy, steps=learning.local_steps,
                                  batch_size=learning.batch_size, lr=learning.lr, seed=seed)
        out: KnowledgeRoundOutput = await trio.to_thread.run_sync(
            run_knowledge_round, d.model, self.data, self.keys, self.cache, inp, self.rows)
        m = d.metrics
        m.examples, m.train_loss, m.val_loss = out.examples, out.train_loss, out.val_loss
        m.val_accuracy, m.alpha, m.drift = out.val_accuracy, {}, {}
        node.round += 1
        await self._publish(out)
        await trio.to_thread.run_sync(learnerstate.save, d.state, self.learner, node.round)
        m.round = node.round
        d.participation.knowledge_round(
            round_no=node.round, own_id=node.id, clock=inp.clock, published=m.version,
            used=[(b.origin, b.version, b.created_at) for b in peers])
        acc = "-" if m.val_accuracy is None else f"{m.val_accuracy:.3f}"
        log.info("round %d: version %d, loss %.4f, val acc %s, knowledge from %d peers "
                 "(%d of %d samples taught)", node.round, m.version, m.train_loss, acc,
                 out.peers, out.taught, out.examples)
        release_freed_memory()
        sdnotify.status(f"round {node.round}, version {m.version}, {len(node.cache)} cached")

    async def _publish(self, out: KnowledgeRoundOutput) -> None:
        """Keys when new (content-addressed), then this round's knowledge; versions from
        the node's one sequence, the counter persisted before either can leave."""
        d, node, m = self.daemon, self.node, self.daemon.metrics
        version = max(m.version, node.own_max_version_seen) + 1
        keys_new = node.own_keys is None
        d.state.save_counters(Counters(round=node.round, version=version + keys_new))
        key, fleet = d.key, d.cfg.fleet.fleet_id
        if keys_new:
            held_keys = await trio.to_thread.run_sync(lambda: sign_own_keys(
                key, fleet, self.schema, version=version, created_at=d.now(),
                keys=self.keys[:self.rows], labels=self.labels[:self.rows]))
            node.set_own_keys(held_keys)
            version += 1
        assert node.own_keys is not None
        keys_digest = node.own_keys.entry.meta.digest
        held = await trio.to_thread.run_sync(lambda: sign_own_knowledge(
            key, fleet, self.schema, version=version, created_at=d.now(),
            ids=np.arange(self.rows, dtype=np.int32), logits=out.logits,
            keys_digest=keys_digest, group=node.group))
        node.set_own(held.entry, held.message)
        node.own = held  # the typed holding (set_own recorded the version in the ledger)
        m.version = version  # the daemon wakes the gossip loop: a new entry to offer


def attach(daemon: Daemon) -> KnowledgeMode:
    """Switch a daemon built for weights to knowledge mode: its node becomes a
    :class:`KnowledgeState` holding the same keys, manifest, ledger and counters."""
    mode = KnowledgeMode(daemon)
    daemon.node = mode.node
    return mode
