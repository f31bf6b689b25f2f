"""``[learning] mode = "weights"``: Cached-DFL's local step (blend → K proximal steps →
publish decision) and what it carries from one round to the next.

Wiring only: the decisions are :func:`peerd.core.round` 's, run with in-place, low-memory
operations by :func:`peerd.learn.trainer.run_round`; the entry is signed into its state file
by :mod:`peerd.store.persist`. The round around the step is
:func:`peerd.daemon.modes.base.run_round`'s. This module must not parse wire bytes or touch
files itself.
"""

from __future__ import annotations

import hashlib
import logging
import math
from typing import Protocol

import torch
import trio
from torch import nn

from peerd.control.audit import AuditLearner
from peerd.control.status import LearnerStatus, ViewsStatus
from peerd.core.drift import drift, overdue, should_publish
from peerd.core.entry import CacheItem
from peerd.core.modes import ModeName
from peerd.core.round import parse_blend
from peerd.core.staleness import Clock
from peerd.daemon.external import ExternalSide
from peerd.daemon.host import ModeHost, expire_stale
from peerd.daemon.learner import open_external, open_worker
from peerd.daemon.modes.base import Step, val_accuracy_text
from peerd.daemon.normwatch import NormWatch
from peerd.daemon.notices import plural
from peerd.learn.learner.check import schema_of
from peerd.learn.learner.contract import LearnerError, LearnerKind
from peerd.learn.learner.step import Fitted, LearnerRound
from peerd.learn.learner.worker import WorkerLearner
from peerd.learn.ondevice import DeviceCopy
from peerd.learn.trainer import LocalTraining, RoundInput, RoundOutput, drift_to, run_round
from peerd.node.peers import PeerTable
from peerd.node.state import Held, NodeState
from peerd.store import persist, spool

log = logging.getLogger(__name__)


class Daemon(ModeHost, Protocol):
    """What weight mode uses of :class:`peerd.daemon.daemon.Daemon` (see
    :mod:`peerd.daemon.host`)."""

    peers: PeerTable


class WeightsMode:
    """The weight-mode half of one daemon: update norms and the local policy's state across
    rounds, and whether the model is the published entry bit for bit."""

    name = ModeName.WEIGHTS
    learner = None  # the published entry is the model: nothing else to keep

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.node: NodeState = daemon.node
        cfg = daemon.cfg
        self.norms = NormWatch(cfg.validation.update_norm_policy)
        self.local = LocalTraining.of(cfg.learning)  # FedBSS warm-up state across rounds
        #: The model equals the published entry's tensors bit for bit (see RoundInput).
        self.model_is_published = False
        self._out: RoundOutput | None = None
        self._meta_only: tuple[CacheItem, ...] = ()
        self._silent_for = math.inf
        self._clock: Clock | None = None
        self._drift: dict[str, float] = {}
        #: ``[learner]``: the worker running the user's learner (None: the builtin one),
        #: what status shows of it, and the own example count α uses before a fit (the last
        #: fit's; 1 before any: an untrained start weighs as little as a model can without
        #: emptying a lone node's plan, which would then sum to zero).
        self.external: ExternalSide | None = None
        self.worker: WorkerLearner | None = None
        if cfg.learner.kind == LearnerKind.EXTERNAL:
            self.external, self.learner_stats = open_external(cfg, daemon.model, self.node.id,
                                                              daemon.now)
            self.external.host = self
        else:
            self.worker, self.learner_stats = open_worker(cfg, daemon.model, self.node.id)
        self._schema = schema_of(daemon.model.state_dict())
        self.own_examples = 1
        #: The builtin learner on a device other than the CPU: the model's copy there.
        device = self.learner_stats.device
        self.on_device = (DeviceCopy(daemon.model, device)
                          if cfg.learner.kind == LearnerKind.BUILTIN and device != "cpu"
                          else None)

    def restore_own(self, own: Held) -> None:
        d = self.daemon
        d.model.load_state_dict({k: v.clone() for k, v in own.entry.params.items()})
        d.metrics.published_params = own.entry.params
        self.model_is_published = True
        self.own_examples = max(own.entry.meta.num_examples, 1)

    def _learner_round(self) -> LearnerRound | None:
        if self.worker is None:
            return None
        lc = self.daemon.cfg.learner
        return LearnerRound(learner=self.worker, schema=self._schema, round=self.node.round + 1,
                            device=self.learner_stats.device, run_config=lc.run_config,
                            own_examples=self.own_examples,
                            max_examples=self.daemon.cfg.validation.max_examples)

    def _learner_outcome(self, out: RoundOutput) -> None:
        """A learner round's failure (logged once, counted, audited) or its fit's numbers."""
        if self.worker is None:
            return
        round_no = self.node.round + 1
        failure = out.learner_failure
        if failure is None:
            self.own_examples = max(out.examples, 1)  # see __init__
            self.learner_stats.fitted(out.learner_metrics or {})
            return
        self._failed(round_no, failure)

    def learner_block(self) -> LearnerStatus | None:
        """The status's learner block (None: the builtin learner)."""
        w, ext, st = self.worker, self.external, self.learner_stats
        if w is None and ext is None:
            return None
        return LearnerStatus(kind=st.kind, entry=st.entry, device=st.device,
                             metrics=dict(st.metrics), metrics_dropped=st.metrics_dropped,
                             failed=dict(st.failed), last_failure=st.last_failure,
                             last_detail=st.last_detail, last_failed_round=st.last_failed_round,
                             worker_pid=None if w is None else w.pid,
                             worker_restarts=0 if w is None else w.restarts,
                             external=None if ext is None else ext.status())

    # ------------------------------------------------------------------ kind = "external"
    def blend_input(self) -> tuple[RoundInput, int]:
        """The external learner's ``blend``, on the loop thread: what expired is dropped as
        at a round's start, then the round's input as of now (see ExternalHost)."""
        d = self.daemon
        now = d.now()
        expire_stale(d, self.node, now)
        return self._input(now), self.own_examples

    def blend_done(self) -> None:
        self.node.release()

    def refused(self, exc: LearnerError) -> None:
        """An external publish refused by the checks: as a refused learner round."""
        self._failed(self.node.round + 1, exc)

    def _failed(self, round_no: int, failure: LearnerError) -> None:
        self.learner_stats.failed_round(round_no, failure)
        log.warning("round %d: the learner failed (%s): %s; nothing published", round_no,
                    failure.reason.value, failure.detail)
        self.daemon.state.audit("learner_failed", round=round_no,
                                reason=failure.reason.value, detail=failure.detail)

    async def _external_round(self, ext: ExternalSide, silent_for: float) -> RoundOutput:
        """The round of an external learner: the publish waiting (its model copied into the
        model, published by the core rule: moved more than ε, or overdue), or, when none
        came, no training and no publication but the republication of an overdue entry."""
        d, learning, own = self.daemon, self.daemon.cfg.learning, self.node.id
        taken = ext.take()
        limit = learning.silence_limit_s
        if taken is None:
            return RoundOutput(
                params=_views(d.model), alpha={own: 1.0}, examples=self.own_examples,
                train_loss=math.nan, val_loss=math.nan, val_accuracy=None, moved=0.0,
                publish=self.node.own is not None and overdue(silent_for, limit))
        published = d.metrics.published_params

        def into_model() -> float:
            with torch.no_grad():
                for name, t in d.model.state_dict().items():
                    t.copy_(taken.params[name])
            return math.inf if published is None else drift(_views(d.model), published)

        async with ext.lock:
            self.model_is_published = False
            moved = await trio.to_thread.run_sync(into_model)
        blend, ext.last_blend = ext.last_blend, None  # the blend it trained from, reported once
        metrics = dict(taken.metrics)
        self.own_examples = max(taken.num_examples, 1)
        self.learner_stats.fitted(metrics)
        acc = metrics.get("accuracy")
        return RoundOutput(
            params=_views(d.model), alpha={own: 1.0} if blend is None else blend.alpha,
            examples=taken.num_examples, train_loss=Fitted(taken, None).train_loss,
            val_loss=metrics.get("val_loss", math.nan), val_accuracy=acc,
            moved=moved, publish=should_publish(moved, learning.epsilon, silent_for=silent_for,
                                                max_silence=limit),
            blend_refused=None if blend is None else blend.refused,
            update_norms=None if blend is None else blend.update_norms,
            norm_verdicts=None if blend is None else blend.norm_verdicts,
            weights=None if blend is None else blend.weights, learner_metrics=metrics)

    def close(self) -> None:
        """Stop the learner's worker (the daemon stops)."""
        if self.worker is not None:
            self.worker.close()

    def _input(self, now: float) -> RoundInput:
        """The round's input at ``now`` (the step's, and an external learner's blend's)."""
        d = self.daemon
        node, learning, state = self.node, d.cfg.learning, d.state
        seed = int.from_bytes(hashlib.sha256(f"{node.id}/{node.round}".encode()).digest()[:8])
        return RoundInput(own_id=node.id, cache=self._cache_meta(), peers=node.blend_inputs(),
                          clock=node.clock(now), policy=learning.alpha_policy,
                          steps=learning.local_steps, batch_size=learning.batch_size,
                          lr=learning.lr, rho=learning.rho, seed=seed,
                          epsilon=learning.epsilon, silent_for_s=self._silent(now),
                          max_silence_s=learning.silence_limit_s,
                          published=d.metrics.published_params,
                          model_is_published=self.model_is_published,
                          keep_anchor=lambda x: spool.spill(x, state.blobs),
                          blend=parse_blend(learning.blend),
                          norm_policy=self.norms.policy, norm_history=self.norms.history,
                          local=self.local, learner=self._learner_round(),
                          on_device=self.on_device)

    def _cache_meta(self) -> tuple[CacheItem, ...]:
        """The cache as metadata only. The round gets this plus a list of entries it consumes
        (see RoundInput.peers): nothing here keeps a reference that would pin a superseded
        entry during training."""
        return tuple(CacheItem(i.meta, i.received_from, i.received_at, verified=i.verified)
                     for i in self.node.cache)

    def _silent(self, now: float) -> float:
        # Peers age our entry by its created_at: past max_silence the round republishes it
        # even below ε (core.drift.should_publish), so a quiet node never expires at peers.
        own = self.node.own
        return math.inf if own is None else now - own.entry.meta.created_at

    async def step(self, now: float) -> Step:
        d = self.daemon
        node, learning, state = self.node, d.cfg.learning, d.state
        silent_for = self._silent(now)
        if self.external is not None:
            clock = node.clock(now)
            meta_only = self._cache_meta()
            out = await self._external_round(self.external, silent_for)
        else:
            inp = self._input(now)
            clock, meta_only = inp.clock, inp.cache
            self.model_is_published = False  # the round trains the model in place
            # The core round (peerd.core.round) decides α, x̄ and whether to publish; the
            # daemon only carries the decision out (sign, persist, announce).
            out = await trio.to_thread.run_sync(run_round, d.model, d.task, inp)
        # Drifts to what the cache holds now (entries may have been replaced meanwhile), for
        # the status; off the event loop, since each reads a whole model.
        cached = node.blend_inputs()

        def drifts() -> dict[str, float]:
            try:
                return drift_to(out.params, cached)
            finally:
                node.release()  # the round and the drifts read every entry; let them go

        drift = await trio.to_thread.run_sync(drifts)
        self._learner_outcome(out)
        self.norms.record(out, node, state, learning.blend)
        self._out, self._meta_only, self._silent_for = out, meta_only, silent_for
        self._clock, self._drift = clock, drift
        return Step(examples=out.examples, train_loss=out.train_loss, val_loss=out.val_loss,
                    val_accuracy=out.val_accuracy, publish=out.publish, alpha=out.alpha,
                    drift=drift, weights=out.weights)

    def versions(self) -> int:
        return 1

    async def publish(self, version: int, now: float) -> None:
        d, node, out = self.daemon, self.node, self._out
        assert out is not None
        learning = d.cfg.learning
        if learning.epsilon > 0 and out.moved <= learning.epsilon:
            log.info("republishing: %.0f s since the last entry (drift %.3g <= epsilon)",
                     self._silent_for, out.moved)
        state = d.state
        # Signed straight into its state file (persist.publish_own): no payload copy.
        held = await trio.to_thread.run_sync(
            lambda: persist.publish_own(state, node, params=out.params,
                                        version=version, created_at=d.now(),
                                        num_examples=out.examples))
        node.set_own(held.entry, held.message, held.frame)
        # The entry's tensors: the last published model is kept once (on disk when
        # mapped), not a second time in memory.
        d.metrics.published_params = held.entry.params
        # Signed from the model's own tensors; in a lossy encoding the entry is their
        # rounding, so the model no longer equals it and cannot stand in for x̄ (trainer.py).
        self.model_is_published = node.encoding.lossless

    def _audit_learner(self, out: RoundOutput) -> AuditLearner | None:
        """The round record's learner part: its metrics (already checked and bounded by
        peerd.learn.learner.check), or its failure (None: the builtin learner)."""
        if self.daemon.cfg.learner.kind == "builtin":
            return None
        failure = out.learner_failure
        return AuditLearner(fit_metrics=dict(out.learner_metrics or {}),
                            eval_metrics=dict(out.learner_eval_metrics or {}),
                            failure=None if failure is None else failure.reason.value,
                            detail=None if failure is None else failure.detail)

    def audit(self, round_no: int, published: int | None) -> None:
        if self.external is not None:
            self.external.round_done(round_no, published)
        assert self._out is not None
        assert self._clock is not None
        self.daemon.participation.weights_round(
            round_no=round_no, out=self._out, own_id=self.node.id, cache=self._meta_only,
            clock=self._clock, drift=self._drift, published=published,
            learner=self._audit_learner(self._out))

    def summary(self) -> str:
        m = self.daemon.metrics
        return (f"loss {m.train_loss:.4f}, val acc {val_accuracy_text(m.val_accuracy)}, "
                f"cache {len(self.node.cache)}")

    def notify_detail(self) -> str:
        return f"{len(self.node.cache)} cached, {plural(len(self.daemon.peers), 'peer', 'peers')}"

    def status_block(self, now: float) -> ViewsStatus | None:
        return None


def _views(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's own tensors (views, not copies)."""
    return {k: v.detach() for k, v in model.state_dict().items()}
