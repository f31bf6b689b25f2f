"""``[learning] mode = "knowledge"``: the daemon's knowledge round and what it settles once.

Wiring only: the round around the step is :func:`peerd.daemon.modes.base.run_round`'s (the
registry, :mod:`peerd.daemon.modes`, builds a :class:`KnowledgeMode` at start-up); the gossip
state is
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
import math
from typing import Protocol

import numpy as np
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.control.status import ViewsStatus
from peerd.core.distill import Distillation
from peerd.core.modes import ModeName
from peerd.daemon.host import ModeHost
from peerd.daemon.modes.base import Step, val_accuracy_text
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
from peerd.node.state import Held
from peerd.protocol.limits import MAX_KNOWLEDGE_SAMPLES

log = logging.getLogger(__name__)


class Daemon(ModeHost, Protocol):
    """What knowledge mode uses of :class:`peerd.daemon.daemon.Daemon` (see
    :mod:`peerd.daemon.host`)."""

    key: Ed25519PrivateKey


class KnowledgeMode:
    """The knowledge half of one daemon: its node state, sample keys and knowledge cache."""

    name = ModeName.KNOWLEDGE

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
                                   r=learning.knowledge.neighbours,
                                   form=learning.knowledge.form)  # type: ignore[arg-type]
        # local_steps = 0 (knowledge mode's default): one local epoch, ⌈n / batch⌉ steps.
        self.steps = learning.local_steps or math.ceil(len(self.data.y_train)
                                                       / learning.batch_size)
        # What the model learned survives a restart: the learner file, saved every round.
        self.learner = learnerstate.KnowledgeLearner(daemon.model, task=cfg.task.name,
                                                     model_name=cfg.task.model)
        learnerstate.restore(daemon.state, self.learner)
        self._out: KnowledgeRoundOutput | None = None
        self._inp: KnowledgeRoundInput | None = None
        self._peers: list[KnowledgeBatch] = []

    def restore_own(self, own: Held) -> None:
        return None  # its own entries are not kept across restarts: the learner file is

    async def step(self, now: float) -> Step:
        d, node, learning = self.daemon, self.node, self.daemon.cfg.learning
        peers = [KnowledgeBatch(r.origin, r.version, r.created_at, r.keys, r.labels, r.logits)
                 for r in node.batches()]
        seed = int.from_bytes(hashlib.sha256(f"{node.id}/{node.round}".encode()).digest()[:8])
        inp = KnowledgeRoundInput(own_id=node.id, clock=node.clock(now), peers=peers,
                                  policy=self.policy, steps=self.steps,
                                  batch_size=learning.batch_size, lr=learning.lr, seed=seed,
                                  # the node's first round (round counts from 0 until it ends)
                                  zero_untaught=node.round == 0
                                  and learning.knowledge.round1_knowledge == "zero")
        out: KnowledgeRoundOutput = await trio.to_thread.run_sync(
            run_knowledge_round, d.model, self.data, self.keys, self.cache, inp, self.rows)
        self._out, self._inp, self._peers = out, inp, peers
        return Step(examples=out.examples, train_loss=out.train_loss, val_loss=out.val_loss,
                    val_accuracy=out.val_accuracy, publish=True)

    def versions(self) -> int:
        return 2 if self.node.own_keys is None else 1  # keys first, once

    async def publish(self, version: int, now: float) -> None:
        """Keys when new (content-addressed), then this round's knowledge, under the
        consecutive versions the round reserved."""
        d, node, out = self.daemon, self.node, self._out
        assert out is not None
        key, fleet = d.key, d.cfg.fleet.fleet_id
        if node.own_keys is None:
            held_keys = await trio.to_thread.run_sync(lambda: sign_own_keys(
                key, fleet, self.schema, version=version, created_at=d.now(),
                keys=self.keys[:self.rows], labels=self.labels[:self.rows]))
            node.set_own_keys(held_keys)
            version += 1
        assert node.own_keys is not None
        keys_digest = node.own_keys.entry.meta.digest
        knowledge_version = version
        held = await trio.to_thread.run_sync(lambda: sign_own_knowledge(
            key, fleet, self.schema, version=knowledge_version, created_at=d.now(),
            ids=np.arange(self.rows, dtype=np.int32), logits=out.logits,
            keys_digest=keys_digest, group=node.group))
        node.set_own(held.entry, held.message)
        node.own = held  # the typed holding (set_own recorded the version in the ledger)

    def audit(self, round_no: int, published: int | None) -> None:
        assert self._inp is not None
        self.daemon.participation.typed_round(
            mode=self.name, round_no=round_no, own_id=self.node.id, clock=self._inp.clock,
            published=published,
            used=[(b.origin, b.version, b.created_at) for b in self._peers])

    def summary(self) -> str:
        m, out = self.daemon.metrics, self._out
        assert out is not None
        return (f"loss {m.train_loss:.4f}, val acc {val_accuracy_text(m.val_accuracy)}, "
                f"knowledge from {out.peers} peers ({out.taught} of {out.examples} samples "
                "taught)")

    def notify_detail(self) -> str:
        return f"{len(self.node.cache)} cached"

    def status_block(self, now: float) -> ViewsStatus | None:
        return None
