"""Flower learners (``[learner] kind = "flower"``): an unchanged Flower 1.x app as a learner.

``entry`` names what Flower's own ``[tool.flwr.app.components] clientapp`` would name — a
``ClientApp`` — or a bare legacy ``client_fn(context) -> Client``; :func:`flower_learner`
wraps it in a :class:`~peerd.learn.learner.contract.Learner`. Each ``fit``/``evaluate``
builds the ``Message`` a Flower ``ServerApp`` would send that node, calls the app the way
Flower's runtime does (``client_app(message=..., context=...)``: SuperNode's
``run_clientapp`` and the simulation's ``ClientAppActor`` both do exactly that) and reads
the reply as Flower's strategies read it.

What peerd sends, for both kinds of app, in the train/evaluate config (a Message-API app
reads it as ``msg.content["config"]``, a ``NumPyClient`` as its ``config`` dict):

==================  =====================================================================
``"server-round"``  the node's round (what Flower's ``FedAvg`` puts there)
``"proximal-mu"``   ρ, the weight of the proximal term ρ/2‖x − x̄‖² (Flower's ``FedProx``)
``"lr"``            ``[learning] lr`` (the key Flower's PyTorch quickstart reads)
``"local-steps"``   the step budget K (``[learning] local_steps``)
``"batch-size"``    ``[learning] batch_size``
``"seed"``          the per-round seed
``"device"``        ``[learner] device``, resolved (``"cpu"``, ``"cuda:0"``, …)
==================  =====================================================================

A Message-API app gets ``content["arrays"]`` (an ``ArrayRecord`` of the blended model x̄,
by ``state_dict()`` name) and ``content["config"]``; its train reply must hold one
``ArrayRecord`` (``"arrays"``) and one ``MetricRecord`` (``"metrics"``) with
``"num-examples"``, as ``FedAvg`` demands; every other number in that record is a metric.
Its evaluate reply's ``MetricRecord`` gives the loss (``"eval_loss"``, else ``"loss"``),
``"num-examples"`` and the metrics, ``"eval_acc"`` read as ``"accuracy"``. A legacy app gets
what Flower's legacy strategies send (``FitIns``/``EvaluateIns`` in ``RecordDict`` form),
so that ``Client``/``NumPyClient`` behave as under Flower: parameters are the model's
arrays in ``state_dict()`` order.

The ``Context`` is Flower's: ``node_config`` and ``run_config`` from ``[learner.node_config]``
and ``[learner.run_config]``, a ``node_id`` derived from the peer id, and a ``state`` kept
across rounds, committed only when a call succeeds (Flower's runtime drops the state of a
ClientApp that raised).

Failures: the app raising, or replying with a Flower ``Error``, is ``Refusal.RAISED``; a
reply without arrays or ``"num-examples"`` (or not a ``Message``) is ``Refusal.MALFORMED``;
arrays whose names match neither the model's nor Flower's positional ``"0"``, ``"1"``, … is
``Refusal.SCHEMA``. flwr is imported only here, so peerd runs without the ``flower`` extra.
"""

from __future__ import annotations

import copy
import hashlib
import os
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from peerd.learn.learner.contract import (
    EvalResult,
    FitConfig,
    FitResult,
    LearnerContext,
    LearnerError,
    Params,
    Refusal,
    Scalar,
)

if TYPE_CHECKING:
    from flwr.app import RecordDict
    from flwr.clientapp import ClientApp

# flwr reads this once, when flwr.supercore.telemetry is first imported: a node on a LAN
# without internet must not try to phone Flower's telemetry server (a 60 s timeout each).
# A user who sets it keeps their choice.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

#: The config keys peerd sends (module docstring).
CONFIG_KEYS = (
    "server-round", "proximal-mu", "lr", "local-steps", "batch-size", "seed", "device",
)
#: Where the loss of an evaluate reply is read, first match wins (Flower's quickstarts
#: report ``"eval_loss"``; its strategies' own evaluate functions ``"loss"``).
LOSS_KEYS = ("eval_loss", "loss")
#: Metric names read as peerd's ``"accuracy"`` (the status's validation accuracy).
ACCURACY_KEYS = ("eval_acc", "accuracy")
NUM_EXAMPLES = "num-examples"
#: Flower's run id is the SuperLink's; peerd has no run, so every node uses this one.
RUN_ID = 0
#: Who sends a ClientApp its messages in Flower (flwr.common.constant.SUPERLINK_NODE_ID).
SUPERLINK_NODE_ID = 1


class FlowerLearner:
    """A Flower ``ClientApp`` behind the learner contract (:func:`flower_learner`)."""

    def __init__(self, app: ClientApp, ctx: LearnerContext, *, legacy: bool) -> None:
        from flwr.app import RecordDict

        self._app = app
        self._legacy = legacy
        self._node_id = flower_node_id(ctx.node_id)
        self._node_config = dict(ctx.node_config)
        self._run_config = dict(ctx.run_config)
        self._state: RecordDict = RecordDict()

    @property
    def legacy(self) -> bool:
        """Whether the app is a legacy ``client_fn`` one (``FitIns``/``FitRes`` messages)."""
        return self._legacy

    def fit(self, params: Params, anchor: Params, config: FitConfig) -> FitResult:
        from flwr.app import MessageType

        if self._legacy:
            return self._fit_legacy(params, config)
        content = _message_content(params, config)
        reply = self._call(content, MessageType.TRAIN, config.round)
        arrays = _one_record(reply.array_records, "arrays", "ArrayRecord")
        metrics = _one_record(reply.metric_records, "metrics", "MetricRecord")
        return FitResult(
            params=_params_from_named(arrays.to_numpy_ndarrays(), list(arrays.keys()), params),
            num_examples=_num_examples(metrics.get(NUM_EXAMPLES)),
            metrics=_numbers(metrics, skip=(NUM_EXAMPLES,)),
        )

    def evaluate(self, params: Params, config: FitConfig) -> EvalResult:
        from flwr.app import MessageType

        if self._legacy:
            return self._evaluate_legacy(params, config)
        content = _message_content(params, config)
        reply = self._call(content, MessageType.EVALUATE, config.round)
        metrics = _one_record(reply.metric_records, "metrics", "MetricRecord")
        loss = next((metrics[k] for k in LOSS_KEYS if k in metrics), None)
        if not _is_number(loss):
            raise LearnerError(
                Refusal.MALFORMED, f"the evaluate reply has no loss (one of {LOSS_KEYS})"
            )
        return EvalResult(
            loss=float(loss),  # type: ignore[arg-type]
            num_examples=_num_examples(metrics.get(NUM_EXAMPLES)),
            metrics=_numbers(metrics, skip=(NUM_EXAMPLES, *LOSS_KEYS)),
        )

    def _fit_legacy(self, params: Params, config: FitConfig) -> FitResult:
        from flwr.app import MessageType
        from flwr.common import Code, FitIns, ndarrays_to_parameters, parameters_to_ndarrays
        from flwr.compat.common import recorddict_compat as compat

        ins = FitIns(ndarrays_to_parameters(_ndarrays(params)), dict(_config(config)))
        reply = self._call(compat.fitins_to_recorddict(ins, keep_input=True),
                           MessageType.TRAIN, config.round)
        try:
            res = compat.recorddict_to_fitres(reply, keep_input=False)
        except (KeyError, TypeError, ValueError) as err:
            raise LearnerError(Refusal.MALFORMED, f"not a FitRes reply: {err!r}") from err
        if res.status.code != Code.OK:
            raise LearnerError(Refusal.RAISED, f"fit status {res.status.code.name}: "
                               f"{res.status.message}")
        arrays = parameters_to_ndarrays(res.parameters)
        return FitResult(
            params=_params_from_named(arrays, [str(i) for i in range(len(arrays))], params),
            num_examples=_num_examples(res.num_examples),
            metrics=_numbers(res.metrics),
        )

    def _evaluate_legacy(self, params: Params, config: FitConfig) -> EvalResult:
        from flwr.app import MessageType
        from flwr.common import Code, EvaluateIns, ndarrays_to_parameters
        from flwr.compat.common import recorddict_compat as compat

        ins = EvaluateIns(ndarrays_to_parameters(_ndarrays(params)), dict(_config(config)))
        reply = self._call(compat.evaluateins_to_recorddict(ins, keep_input=True),
                           MessageType.EVALUATE, config.round)
        try:
            res = compat.recorddict_to_evaluateres(reply)
        except (KeyError, TypeError, ValueError) as err:
            raise LearnerError(Refusal.MALFORMED, f"not an EvaluateRes reply: {err!r}") from err
        if res.status.code != Code.OK:
            raise LearnerError(Refusal.RAISED, f"evaluate status {res.status.code.name}: "
                               f"{res.status.message}")
        if not _is_number(res.loss):
            raise LearnerError(Refusal.MALFORMED, f"evaluate loss {res.loss!r}")
        return EvalResult(
            loss=float(res.loss),
            num_examples=_num_examples(res.num_examples),
            metrics=_numbers(res.metrics),
        )

    def _call(self, content: RecordDict, message_type: str, server_round: int) -> RecordDict:
        """One message through the app as Flower's runtime sends it; the reply's content."""
        from flwr.app import DEFAULT_TTL, Context, Message, Metadata

        # The metadata the SuperLink would stamp on it (Message(content, dst_node_id, type)
        # reads the run id from the runtime's TaskIdentity, which is not set outside one):
        # the grid's group id is the server round, the message id a fresh uuid (as the
        # simulation's), and it comes from the SuperLink's node id.
        metadata = Metadata(
            run_id=RUN_ID,
            message_id=uuid.uuid4().hex,
            src_node_id=SUPERLINK_NODE_ID,
            dst_node_id=self._node_id,
            reply_to_message_id="",
            group_id=str(server_round),
            created_at=time.time(),
            ttl=DEFAULT_TTL,
            message_type=message_type,
        )
        message = Message(content=content, metadata=metadata)  # type: ignore[call-overload, unused-ignore]
        # Flower's runtime hands the app a deserialized copy of the node's state and keeps
        # it only when the app returns (run_clientapp: "Don't update/change NodeState").
        context = Context(
            run_id=RUN_ID,
            node_id=self._node_id,
            node_config=dict(self._node_config),
            state=copy.deepcopy(self._state),
            run_config=dict(self._run_config),
        )
        try:
            reply = self._app(message=message, context=context)
        except LearnerError:
            raise
        # Any failure of user code fails the round (Flower's runtime catches as widely).
        except Exception as err:
            raise LearnerError(Refusal.RAISED, f"{type(err).__name__}: {err}") from err
        if not isinstance(reply, Message):
            raise LearnerError(
                Refusal.MALFORMED, f"the ClientApp returned {type(reply).__name__}, not a Message"
            )
        if reply.has_error():
            raise LearnerError(
                Refusal.RAISED,
                f"the reply carries Flower error {reply.error.code}: {reply.error.reason}",
            )
        if not reply.has_content():
            raise LearnerError(Refusal.MALFORMED, "the reply has no content")
        self._state = context.state
        return reply.content


def flower_learner(target: object, ctx: LearnerContext) -> FlowerLearner:
    """The learner for ``[learner] entry`` when ``kind = "flower"``: ``target`` is the
    imported entry — a ``ClientApp`` (``@app.train()``/``@app.evaluate()`` or built with
    ``client_fn=``), a bare ``client_fn(context)`` returning a ``Client`` (or, as Flower
    tolerates, a ``NumPyClient``), or a ``NumPyClient`` instance.

    Raises :class:`ImportError` (one line) when flwr is not installed and :class:`TypeError`
    when ``target`` is none of these: both are start-up errors of the worker."""
    try:
        from flwr.client import Client, NumPyClient
        from flwr.clientapp import ClientApp
    except ImportError as err:
        raise ImportError(
            "[learner] kind = \"flower\" needs flwr: pip install 'peerd[flower]'"
        ) from err

    if isinstance(target, ClientApp):
        return FlowerLearner(target, ctx, legacy=_built_with_client_fn(target))
    if isinstance(target, NumPyClient | Client):
        client = target.to_client() if isinstance(target, NumPyClient) else target
        return FlowerLearner(ClientApp(client_fn=lambda context: client), ctx, legacy=True)
    if callable(target):
        # ClientApp(client_fn=...) is how Flower itself runs a bare client_fn (and where it
        # checks the signature); a wrong signature is its ValueError, re-raised as ours.
        try:
            app = ClientApp(client_fn=target)
        except ValueError as err:
            raise TypeError(f"[learner] entry is not a Flower client_fn: {err}") from err
        return FlowerLearner(app, ctx, legacy=True)
    raise TypeError(
        f"[learner] entry is a {type(target).__name__}: kind = \"flower\" takes a ClientApp, "
        "a client_fn or a NumPyClient"
    )


def flower_node_id(node_id: str) -> int:
    """Flower's integer node id for a peer id: stable, positive, within int64 (the
    SuperLink's node ids are random 64-bit numbers; nothing in a ClientApp depends on how
    they are made)."""
    return int.from_bytes(hashlib.sha256(node_id.encode()).digest()[:8], "big") >> 1


def _built_with_client_fn(app: ClientApp) -> bool:
    # Flower keeps which API a ClientApp speaks in `_call` (set by client_fn=, None for
    # the decorators) and offers no public way to ask; the server side of Flower knows it
    # because the user picks a legacy or a Message strategy. Read it defensively: an app
    # without the attribute (a later flwr) is a Message-API one.
    return getattr(app, "_call", None) is not None


def _config(config: FitConfig) -> dict[str, Scalar]:
    values: dict[str, Scalar] = {
        "server-round": config.round,
        "proximal-mu": float(config.rho),
        "lr": float(config.lr),
        "local-steps": config.steps,
        "batch-size": config.batch_size,
        # Flower's records carry sint64: a 64-bit unsigned seed is folded into range.
        "seed": config.seed % 2**63,
        "device": config.device,
    }
    return values


def _message_content(params: Params, config: FitConfig) -> RecordDict:
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    record = ArrayRecord()
    for name, array in zip(params, _ndarrays(params), strict=True):
        record[name] = Array.from_numpy_ndarray(array)
    return RecordDict({"arrays": record, "config": ConfigRecord(_config(config))})  # type: ignore[arg-type, unused-ignore]


def _ndarrays(params: Params) -> list[np.ndarray[Any, Any]]:
    out = []
    for name, tensor in params.items():
        if tensor.dtype == torch.bfloat16:
            raise LearnerError(
                Refusal.SCHEMA, f"{name} is bfloat16: Flower's arrays are NumPy arrays"
            )
        out.append(tensor.detach().cpu().numpy())
    return out


def _one_record(records: Mapping[str, Any], name: str, kind: str) -> Any:
    """The reply's record called ``name``, else its only record of that kind (Flower's
    strategies take the one ArrayRecord/MetricRecord, whatever it is called)."""
    if name in records:
        return records[name]
    if len(records) == 1:
        return next(iter(records.values()))
    raise LearnerError(
        Refusal.MALFORMED,
        f"the reply holds {len(records)} {kind}s {sorted(records)}, none called {name!r}",
    )


def _params_from_named(
    arrays: list[np.ndarray[Any, Any]], names: list[str], like: Params
) -> dict[str, torch.Tensor]:
    """The reply's arrays as the model's tensors: by ``state_dict()`` name, or by position
    when the app built its record from a list (``ArrayRecord(list)`` names them "0", "1", …);
    a float array of another width (numpy code drifting to float64) is cast back to the
    model's dtype. Shapes are the contract checker's business."""
    keys = list(like)
    if set(names) == set(keys) and len(names) == len(keys):
        by_name = dict(zip(names, arrays, strict=True))
    elif names == [str(i) for i in range(len(keys))]:
        by_name = dict(zip(keys, arrays, strict=True))
    else:
        raise LearnerError(
            Refusal.SCHEMA,
            f"the reply's arrays {_preview(names)} are neither the model's {_preview(keys)} "
            f"nor {len(keys)} positional ones",
        )
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        array = by_name[key]
        # Not np.ascontiguousarray: it turns a 0-d buffer (num_batches_tracked) into 1-d.
        if not (array.flags.c_contiguous and array.flags.writeable):
            array = np.array(array, order="C")
        tensor = torch.from_numpy(array)
        ref = like[key].dtype
        if tensor.dtype != ref and tensor.is_floating_point() and ref.is_floating_point:
            tensor = tensor.to(ref)
        out[key] = tensor
    return out


def _preview(names: list[str]) -> str:
    return repr(names[:4])[:-1] + (", …]" if len(names) > 4 else "]")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool
    )


def _num_examples(value: object) -> int:
    if not _is_number(value):
        raise LearnerError(
            Refusal.MALFORMED, f"the reply has no numeric {NUM_EXAMPLES!r} (got {value!r})"
        )
    number = float(value)  # type: ignore[arg-type]
    if number != int(number) or number < 0:
        raise LearnerError(Refusal.EXAMPLES, f"{NUM_EXAMPLES} = {value!r}")
    return int(number)


def _numbers(values: Mapping[str, object], skip: tuple[str, ...] = ()) -> dict[str, float]:
    """The numeric metrics, ``eval_acc`` read as ``accuracy``. Lists (which Flower's
    records allow), strings and bytes are left out: peerd's metrics are numbers."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if key in skip or not _is_number(value):
            continue
        out["accuracy" if key in ACCURACY_KEYS else key] = float(value)  # type: ignore[arg-type]
    return out

