"""The daemon's round: one ``nn.Module`` through :func:`peerd.core.round.cached_dfl_round`.

Owns the daemon's heavy steps of a round (the blend in place, weighted or a robust rule of
:mod:`peerd.core.robust`, after update-norm validation (:mod:`peerd.core.updatenorm`) when
configured; the local update in place, x̄
taken from the published entry or kept by the caller's ``keep_anchor``, the drift since
that entry) and evaluation.
The order and the decisions (plan, α, anchor, publish or not) are the core round's.

Runs in a worker thread (``trio.to_thread``): the network never waits for training and
training never waits for the network. It reads an immutable snapshot of the cache taken on
the event-loop thread and returns the new parameters; it never touches ``NodeState`` and does
no publishing itself (signing and persisting are the daemon's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from peerd.core.alpha import AlphaPolicy
from peerd.core.blend import blend_into
from peerd.core.blendrules import RobustError, RobustRule
from peerd.core.drift import drift
from peerd.core.entry import CacheItem, Entry, EntryMeta, Schema
from peerd.core.fedbss import FedBSS
from peerd.core.local_update import LocalResult, LossName, local_update
from peerd.core.plan import BlendPlan
from peerd.core.robust import own_distances, robust_blend_into
from peerd.core.round import (
    PLAIN,
    Anchor,
    Blend,
    BlendPolicy,
    LocalPolicy,
    PublishRule,
    RoundAgent,
    RoundOutcome,
    blend_step,
    cached_dfl_round,
)
from peerd.core.staleness import Clock
from peerd.core.updatenorm import (
    NO_HISTORY,
    NORM_OFF,
    NormAction,
    NormHistory,
    UpdateNormPolicy,
    Verdict,
    gate,
    gated_alpha,
    scaled_weights,
)
from peerd.learn.learner.contract import LearnerError, Metrics
from peerd.learn.learner.step import (
    Fitted,
    LearnerRound,
    evaluate_with,
    fit_config,
    fit_into,
)
from peerd.learn.localpolicy import LocalTraining as LocalTraining  # the daemon imports it here
from peerd.learn.ondevice import DeviceCopy
from peerd.learn.tasks import Task, TaskData


@dataclass(frozen=True, slots=True)
class RoundInput:
    own_id: str
    cache: tuple[CacheItem, ...]  # metadata only (payloads dropped): what α is computed from
    #: The cache's entries, same order. Consumed: run_round empties the list once they are
    #: blended, so an entry the cache replaces while this round trains can be freed at once
    #: instead of being pinned (C superseded models in the worst case) until the round ends.
    peers: list[Entry]
    clock: Clock
    policy: AlphaPolicy
    steps: int
    batch_size: int
    lr: float
    rho: float
    seed: int  # per-round batch order: derived from the node id and round by the caller
    #: Publish only if the trained model moved more than ε from ``published`` (0: always)...
    epsilon: float = 0.0
    #: ... or ``published`` is ``max_silence_s`` old: seconds since it was created, and the
    #: limit (inf: none). A quiet node republishes so that peers never age it out.
    silent_for_s: float = 0.0
    max_silence_s: float = math.inf
    #: The own last published entry's tensors (None: nothing published yet). The drift that
    #: decides publishing is measured from them.
    published: Mapping[str, torch.Tensor] | None = None
    #: The model still equals ``published`` exactly (it was published after the last round,
    #: or restored from it). In a round without peers those tensors are then x̄ itself, so x̄
    #: needs no copy of its own.
    model_is_published: bool = False
    #: Keeps a copy of x̄ when there is no published one to use and returns it (the daemon's:
    #: ``peerd.store.spool.spill``, a file-backed copy that is not a second resident model).
    #: None: local_update clones x̄ in memory.
    keep_anchor: Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]] | None = None
    #: The blend rule (``[learning] blend``): weighted, or a robust rule of peerd.core.robust.
    blend: Blend = BlendPolicy.WEIGHTED
    #: Update-norm validation (``[validation] update_norm_*``) and the norms seen so far.
    norm_policy: UpdateNormPolicy = NORM_OFF
    norm_history: NormHistory = NO_HISTORY
    #: ``[learning] local_policy = "fedbss"``: the policy and its warm-up state, updated by
    #: the round. None: plain training.
    local: LocalTraining | None = None
    #: ``[learner] kind`` other than builtin: the learner trains instead of local_update and
    #: evaluates (peerd.learn.learner.step); the task is not read. None: the built-in one.
    learner: LearnerRound | None = None
    #: The built-in learner on a device other than the CPU (``[learner] device``): its copy
    #: of the model there, which trains and evaluates; the model itself stays on the CPU and
    #: gets the result. None: the model trains itself, on the CPU.
    on_device: DeviceCopy | None = None


@dataclass(frozen=True, slots=True)
class RoundOutput:
    #: The trained model's own tensors (views, not copies: a model's worth of memory saved
    #: each round). Valid until the model trains again; the daemon signs them before that.
    params: dict[str, torch.Tensor]
    alpha: dict[str, float]  # origin -> α used in this round's blend (own included)
    examples: int
    train_loss: float
    val_loss: float
    val_accuracy: float | None  # None for regression
    moved: float  # drift since the last published entry (inf: none yet)
    publish: bool  # the core round's decision: sign and send this model
    #: Why the configured robust blend blended nothing this round (Krum, too few models).
    blend_refused: str | None = None
    #: ‖x_j − x_own‖ of every peer blended this round (update-norm validation on), by origin,
    #: and the verdicts that were not "accepted" (rejected: left out; clipped: scaled).
    update_norms: dict[str, float] | None = None
    norm_verdicts: dict[str, Verdict] | None = None
    #: What each model of the plan counted for in the blend, by origin (own included), once
    #: update-norm validation and the rule are applied: clipping's and Krum's weights, 0 for
    #: a rejected or unselected model. None: the plan's α applies as is (weighted without
    #: changes, or nothing blended), or the rule has no weights (median, trimmed mean).
    weights: dict[str, float] | None = None
    #: A learner's round (RoundInput.learner): why it failed (then ``publish`` is False and
    #: the model is x̄, or trained but unevaluated), and the metrics its fit and its
    #: evaluation reported (each checked and bounded: peerd.learn.learner.check).
    learner_failure: LearnerError | None = None
    learner_metrics: Metrics | None = None
    learner_eval_metrics: Metrics | None = None


#: Rows per forward pass when evaluating, unless the caller passes its training batch size
#: (the daemon does): activations scale with rows × layer width, and a held-out set pushed
#: through a wide layer in one pass would otherwise be the round's largest allocation.
EVAL_BATCH = 256


def evaluate(model: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: LossName,
             batch_size: int = EVAL_BATCH) -> tuple[float, float | None]:
    """Validation loss and (classification) accuracy, without touching gradients."""
    if len(X) == 0:
        return math.nan, None
    model.eval()
    total_loss, correct = 0.0, 0
    with torch.no_grad():
        for lo in range(0, len(X), batch_size):
            xb, yb = X[lo:lo + batch_size], y[lo:lo + batch_size]
            out = model(xb)
            if loss == "cross_entropy":
                total_loss += float(nn.functional.cross_entropy(out, yb, reduction="sum"))
                correct += int((out.argmax(dim=1) == yb).sum())
            else:
                pred = out.squeeze(-1) if out.dim() == yb.dim() + 1 else out
                total_loss += float(nn.functional.mse_loss(pred, yb, reduction="sum"))
    n = len(X)
    if loss == "cross_entropy":
        return total_loss / n, correct / n
    return total_loss / y.numel(), None


def drift_to(params: Mapping[str, torch.Tensor], entries: Sequence[Entry]) -> dict[str, float]:
    """§3.10: how far each cached peer model is from ``params`` (the trained model).

    Each entry's tensors are passed as they are (not copied into a dict): a mapped entry's
    :class:`peerd.store.spool.PagedParams` then lets each tensor's pages go as the next is read.
    """
    return {e.meta.origin: drift(params, e.params) for e in entries}


def run_round(model: nn.Module, task: Task, inp: RoundInput) -> RoundOutput:
    """The daemon's round through :func:`peerd.core.round.cached_dfl_round`: x̄ = blend(own,
    cache) in place; K proximal steps from x̄; evaluate; publish if it moved more than ε or
    its last entry is ``max_silence_s`` old."""
    if inp.learner is not None:
        return _learner_round(model, inp, inp.learner)
    data = task.data()  # re-read every round: local data may have grown
    n = len(data.y_train)
    own_params = {k: v.detach() for k, v in model.state_dict().items()}  # views
    ops = _ModelOps(model, own_params, data, task.loss, inp)
    outcome = _core_round(inp, ops, n, PLAIN if inp.local is None else inp.local.policy)
    (plan,), trained = outcome.plans, outcome.trained
    assert outcome.drift is not None  # a rule was given
    # Evaluated in training-sized batches: no activation buffer larger than a step's.
    dev = inp.on_device
    if dev is None:
        val_loss, acc = evaluate(model, data.X_val, data.y_val, task.loss,
                                 batch_size=inp.batch_size)
    else:  # the copy holds the trained model too: evaluated where it trained
        X_val, y_val = dev.rows(data.X_val, data.y_val)
        val_loss, acc = evaluate(dev.model, X_val, y_val, task.loss, batch_size=inp.batch_size)
    return RoundOutput(
        params=trained.params,
        alpha=plan.as_dict(), examples=n, train_loss=trained.result.mean_loss,
        val_loss=val_loss, val_accuracy=acc,
        moved=outcome.drift[0], publish=outcome.publish[0], blend_refused=ops.refused,
        update_norms=ops.norms, norm_verdicts=ops.verdicts, weights=ops.weights,
    )


def _learner_round(model: nn.Module, inp: RoundInput, lr: LearnerRound) -> RoundOutput:
    """:func:`run_round` with a learner as the local step: the same core round (plan, blend,
    publish decision), ``ops.train`` being the learner's fit; then its evaluation. A failed
    fit or evaluation publishes nothing."""
    own_params = {k: v.detach() for k, v in model.state_dict().items()}  # views
    ops = _ModelOps(model, own_params, None, "cross_entropy", inp)
    # α needs the own example count before this round's fit tells it: the last fit's.
    outcome = _core_round(inp, ops, lr.own_examples, PLAIN)
    (plan,), trained = outcome.plans, outcome.trained
    assert outcome.drift is not None  # a rule was given
    fitted, config = ops.fitted, ops.fit_config
    assert fitted is not None  # ops.train ran the fit
    assert config is not None
    failure, val_loss, acc = fitted.failure, math.nan, None
    eval_metrics: Metrics | None = None
    if fitted.fit is not None:
        try:
            ev = evaluate_with(lr, fitted.fit.params, config)
            val_loss, acc = ev.loss, ev.metrics.get("accuracy")
            eval_metrics = dict(ev.metrics)
        except LearnerError as exc:
            failure = exc
    return RoundOutput(
        params=trained.params, alpha=plan.as_dict(),
        examples=lr.own_examples if fitted.fit is None else fitted.fit.num_examples,
        train_loss=fitted.train_loss, val_loss=val_loss, val_accuracy=acc,
        moved=outcome.drift[0], publish=outcome.publish[0] and failure is None,
        blend_refused=ops.refused, update_norms=ops.norms, norm_verdicts=ops.verdicts,
        weights=ops.weights, learner_failure=failure,
        learner_metrics=None if fitted.fit is None else dict(fitted.fit.metrics),
        learner_eval_metrics=eval_metrics)


def _core_round(inp: RoundInput, ops: _ModelOps, examples: int,
                local: LocalPolicy) -> RoundOutcome[_Trained]:
    """:func:`cached_dfl_round` for the one model ``ops`` holds, ``examples`` its own example
    count for α; publish if it moved more than ε or its last entry is ``max_silence_s`` old."""
    published = inp.published

    def moved(trained: _Trained) -> list[float]:
        return [math.inf if published is None else drift(trained.params, published)]

    return cached_dfl_round(
        [_agent(inp, ops, examples)],
        clock=inp.clock, policy=inp.policy, rho=inp.rho, ops=ops, blend=inp.blend,
        local=local,
        rule=PublishRule(inp.epsilon, moved, silent_for=(inp.silent_for_s,),
                         max_silence=inp.max_silence_s))


def _agent(inp: RoundInput, ops: _ModelOps, examples: int) -> RoundAgent:
    """The round's one agent: the own model with ``examples`` for α, and the cache."""
    # Only the example count and age matter to α; the digest is never looked at here,
    # so the (44 MB) model is not hashed for it.
    own_meta = EntryMeta(inp.own_id, 0, inp.clock.now, Schema.of(ops.own_params).id,
                         examples, "")
    return RoundAgent(own_meta, inp.cache, published=inp.model_is_published)


@dataclass(frozen=True, slots=True)
class Blended:
    """What :func:`blend_now` blended: α by origin (own first) and what the round's output
    reports of a blend (see :class:`RoundOutput`)."""

    alpha: dict[str, float]
    weights: dict[str, float] | None
    refused: str | None
    update_norms: dict[str, float] | None
    norm_verdicts: dict[str, Verdict] | None


def blend_now(model: nn.Module, into: Mapping[str, torch.Tensor], inp: RoundInput,
              examples: int) -> Blended:
    """x̄ as a round of ``inp`` blends it, written into ``into`` (tensors in the model's
    schema: an external learner's buffer) and the model left as it is: the own model is
    copied into ``into``, then the core round's blend step (:func:`blend_step`: plan, α,
    the configured rule, update-norm validation) blends the cache into it in place, as
    :func:`run_round` blends into the model. ``examples``: the own model's count for α."""
    with torch.no_grad():
        for name, t in model.state_dict().items():
            into[name].copy_(t)
    ops = _ModelOps(model, dict(into), None, "cross_entropy", inp)
    (plan,) = blend_step([_agent(inp, ops, examples)], clock=inp.clock, policy=inp.policy,
                         ops=ops, blend=inp.blend)
    return Blended(alpha=plan.as_dict(), weights=ops.weights, refused=ops.refused,
                   update_norms=ops.norms, norm_verdicts=ops.verdicts)


class _ModelOps:
    """The daemon's heavy steps for :func:`cached_dfl_round`: one ``nn.Module`` (a batch of 1),
    blended in place and trained in place."""

    def __init__(self, model: nn.Module, own_params: dict[str, torch.Tensor],
                 data: TaskData | None, loss: LossName, inp: RoundInput) -> None:
        self.model, self.own_params, self.data, self.loss, self.inp = (
            model, own_params, data, loss, inp)
        self.refused: str | None = None  # why a robust rule blended nothing this round
        self.norms: dict[str, float] | None = None
        self.verdicts: dict[str, Verdict] | None = None
        self.weights: dict[str, float] | None = None  # see RoundOutput.weights
        self._kept: list[str] = []  # the plan's origins left after update-norm validation
        #: A learner's fit (RoundInput.learner), once ops.train ran it, and its config.
        self.fitted: Fitted | None = None
        self.fit_config = None if inp.learner is None else fit_config(
            inp.learner, rho=inp.rho, steps=inp.steps, seed=inp.seed,
            batch_size=inp.batch_size, learning_rate=inp.lr)

    def _members(self, plan: BlendPlan) -> tuple[list[Mapping[str, torch.Tensor]],
                                                  list[float], list[float] | None]:
        """The blend's models (own first), α, and per-model update scales, after update-norm
        validation (peerd.core.updatenorm): rejected peers are left out and α renormalised;
        clipped ones get a scale < 1."""
        members: list[Mapping[str, torch.Tensor]] = [self.own_params,
                                                     *(e.params for e in self.inp.peers)]
        alpha = list(plan.alpha)
        policy = self.inp.norm_policy
        self._kept = list(plan.origins)
        if policy.action is NormAction.OFF:
            return members, alpha, None
        dist = own_distances(members)  # one float64 pass over every block
        verdict = gate(dist, policy, self.inp.norm_history)
        origins = plan.origins[1:]
        self.norms = dict(zip(origins, dist[1:], strict=True))
        self.verdicts = {o: v for o, v in zip(origins, verdict.verdicts[1:], strict=True)
                         if v is not Verdict.ACCEPTED}
        alpha = gated_alpha(alpha, verdict)
        keep = [j for j, v in enumerate(verdict.verdicts) if v is not Verdict.REJECTED]
        self._kept = [plan.origins[j] for j in keep]
        scale = [verdict.scale[j] for j in keep]
        return ([members[j] for j in keep], [alpha[j] for j in keep],
                None if all(x == 1.0 for x in scale) else scale)

    def blend(self, plans: Sequence[BlendPlan]) -> None:
        (plan,) = plans
        if plan.alone:
            return
        members, alpha, scale = self._members(plan)
        if scale is not None:
            alpha = scaled_weights(alpha, scale)  # clipping as weights: no clipped copy
        if len(self._kept) < len(plan.origins) or scale is not None:
            self._record_weights(plan, alpha)
        # In place, block by block: no stacked copy of the C + 1 models, no result copy.
        if len(members) > 1:
            blend_into(self.own_params, members, alpha)
        del members
        self.inp.peers.clear()  # see RoundInput.peers

    def blend_robust(self, plans: Sequence[BlendPlan], rule: RobustRule) -> None:
        (plan,) = plans
        if plan.alone:
            return
        members, alpha, scale = self._members(plan)
        # In place and block by block like the weighted blend; Krum and clipping first read
        # every block once for their float64 distances, then blend with the weights they chose.
        try:
            if len(members) > 1:
                used = robust_blend_into(self.own_params, members, alpha, rule, scale=scale)
                if used is not None:
                    self._record_weights(plan, used)
        except RobustError as exc:
            # Krum with fewer models than it needs (a young or thinned cache): refuse to
            # blend this round rather than lower f; the model trains on from itself.
            self.refused = str(exc)
            self.weights = {o: float(o == plan.origins[0]) for o in plan.origins}
        del members
        self.inp.peers.clear()

    def _record_weights(self, plan: BlendPlan, used: Sequence[float]) -> None:
        """The weights the kept models were blended with, by origin; 0 for the others."""
        weights = dict.fromkeys(plan.origins, 0.0)
        weights.update(zip(self._kept, (float(w) for w in used), strict=True))
        self.weights = weights

    def train(self, anchors: Sequence[Anchor]) -> _Trained:
        return self._train(anchors, None)

    def curriculum(self, anchors: Sequence[Anchor], policy: FedBSS) -> _Trained:
        assert self.inp.local is not None
        assert self.inp.local.policy is policy
        return self._train(anchors, self.inp.local)

    def _train(self, anchors: Sequence[Anchor], local: LocalTraining | None) -> _Trained:
        (kind,) = anchors
        inp = self.inp
        if inp.learner is not None:
            return self._fit(inp.learner)
        assert self.data is not None  # the built-in learner trains on the task's data
        # x̄ for the proximal term. Without peers it is the model as published (no copy); with
        # peers, one copy of the blend (kept by ``keep_anchor``, else cloned by local_update).
        # Keeping x̄ as the blend's inputs instead would pin every blended entry through
        # training, and in a busy mesh the cache replaces them meanwhile: up to C superseded
        # models held where one copy would do.
        anchor: Mapping[str, torch.Tensor] | None = None
        if kind is Anchor.PUBLISHED:
            anchor = inp.published
        elif kind is Anchor.BLEND and inp.keep_anchor is not None:
            anchor = inp.keep_anchor(self.own_params)
        step = local_update if local is None else local.train
        model, X, y = self.model, self.data.X_train, self.data.y_train
        dev = inp.on_device
        if dev is not None:
            # The model, the rows and x̄ on the device; the batch order still drawn on the
            # CPU from the round's seed (the same batches as on the CPU).
            dev.load(self.model)
            model, (X, y) = dev.model, dev.rows(X, y)
            if anchor is not None and inp.rho != 0:
                anchor = dev.anchor(anchor)
        result = step(model, X, y, steps=inp.steps,
                      batch_size=inp.batch_size, lr=inp.lr, rho=inp.rho, loss=self.loss,
                      generator=torch.Generator().manual_seed(inp.seed), anchor=anchor)
        if dev is not None:
            dev.store(self.model)
        # The trained model's own tensors (views, not copies).
        return _Trained(result, {k: v.detach() for k, v in self.model.state_dict().items()})

    def _fit(self, lr: LearnerRound) -> _Trained:
        """The learner's fit from the blend: x̄ is the model itself whatever the anchor kind
        (the learner keeps its own copy of x̄ while it trains: the worker's input buffer)."""
        assert self.fit_config is not None
        self.fitted = fitted = fit_into(self.own_params, lr, self.fit_config)
        loss = fitted.train_loss
        return _Trained(LocalResult(self.inp.steps, loss, loss),
                        {k: v.detach() for k, v in self.model.state_dict().items()})


@dataclass(frozen=True, slots=True)
class _Trained:
    result: LocalResult
    params: dict[str, torch.Tensor]
