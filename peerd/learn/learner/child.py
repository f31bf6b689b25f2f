"""The learner worker process: ``python -m peerd.learn.learner.child IN_FD OUT_FD``.

Started by :mod:`peerd.learn.learner.worker`; the user's code (a ``python`` learner or a
``flower`` app) runs here and never in the daemon. It reads framed JSON requests on ``IN_FD``
and answers on ``OUT_FD`` (:mod:`peerd.learn.learner.wire`):

* ``init`` — import ``entry`` and build the learner (an object with ``fit`` and
  ``evaluate``, or a factory called with a :class:`LearnerContext`), map the buffers;
* ``fit`` — map x̄ from the input buffer copy-on-write (``params`` and ``anchor``, two
  private mappings: what the learner writes into one is not seen in the other), call
  ``fit``, check the result against the schema, write its tensors into the output buffer;
* ``evaluate`` — the same for ``evaluate``, the parameters read from the buffer named;
* ``stop`` (or end of file: the daemon is gone) — exit.

A refusal or an exception in the user's code is an answer (``{"ok": false, "reason",
"detail"}``); the worker lives on. Its stdout is redirected to stderr: a learner that prints
must not corrupt anything, and its output lands in the daemon's journal.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from peerd.learn.learner.check import (
    FleetSchema,
    bounded,
    check_eval,
    check_fit,
)
from peerd.learn.learner.check import raised as raised_error
from peerd.learn.learner.contract import (
    FitConfig,
    Learner,
    LearnerContext,
    LearnerError,
    Refusal,
    Scalar,
)
from peerd.learn.learner.wire import (
    Buffer,
    PeerGoneError,
    receive,
    schema_from_json,
    send,
    write_into,
)


def raised(exc: BaseException) -> dict[str, Any]:
    """The answer for an exception in the user's code: its type and first line."""
    return refused(raised_error(exc))


def refused(exc: LearnerError) -> dict[str, Any]:
    return {"ok": False, "reason": exc.reason.value, "detail": bounded(exc.detail)}


def load_entry(entry: str) -> Any:
    module_name, _, attr = entry.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def build_learner(kind: str, entry: str, context: LearnerContext) -> Learner:
    """The learner ``entry`` names: itself when it has ``fit`` and ``evaluate`` (and is not
    a class), else what calling it with ``context`` returns."""
    obj = load_entry(entry)
    if kind == "flower":
        # The adapter (peerd.learn.learner.flower) turns a ClientApp or client_fn into one.
        flower = importlib.import_module("peerd.learn.learner.flower")
        made: Any = flower.flower_learner(obj, context)
    elif isinstance(obj, Learner) and not isinstance(obj, type):
        made = obj
    elif callable(obj):
        made = obj(context)
    else:
        raise TypeError(f"{entry} is neither a learner (fit and evaluate) nor a factory")
    if not isinstance(made, Learner) or isinstance(made, type):
        raise TypeError(f"{entry} gave {type(made).__name__}, which has no fit and evaluate")
    return made


def _scalars(raw: Any) -> dict[str, Scalar]:
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(v, bool | int | float | str)}


def fit_config(raw: Mapping[str, Any]) -> FitConfig:
    return FitConfig(round=int(raw["round"]), rho=float(raw["rho"]), steps=int(raw["steps"]),
                     seed=int(raw["seed"]), device=str(raw["device"]),
                     batch_size=int(raw["batch_size"]), lr=float(raw["lr"]),
                     run_config=_scalars(raw.get("run_config")))


class Worker:
    """One built learner and its buffers."""

    def __init__(self, init: Mapping[str, Any]) -> None:
        self.schema: FleetSchema = schema_from_json(init["schema"])
        self.names = list(self.schema)
        self.buffers = {"in": Path(init["in"]), "out": Path(init["out"])}
        self.max_examples = init.get("max_examples")
        ctx = init["context"]
        context = LearnerContext(node_id=str(ctx["node_id"]), device=str(ctx["device"]),
                                 node_config=_scalars(ctx.get("node_config")),
                                 run_config=_scalars(ctx.get("run_config")))
        torch.set_num_threads(int(init.get("torch_threads", 1)))
        self.learner = build_learner(str(init["kind"]), str(init["entry"]), context)
        # Each mapped once, for the worker's life (peerd.learn.learner.wire.Buffer): the
        # output shared (written here, read by the daemon); x̄ twice, privately, as
        # ``params`` and ``anchor``; and a private view of each for evaluate. A private
        # mapping is reset before each call: the learner's writes of one call are gone.
        self.out = Buffer(self.buffers["out"], self.schema, shared=True)
        self.params = Buffer(self.buffers["in"], self.schema, shared=False)
        self.anchor = Buffer(self.buffers["in"], self.schema, shared=False)
        self.fitted = Buffer(self.buffers["out"], self.schema, shared=False)

    def fit(self, request: Mapping[str, Any]) -> dict[str, Any]:
        config = fit_config(request["config"])
        params, anchor = self.params.reset(), self.anchor.reset()
        result = check_fit(self.learner.fit(params, anchor, config), self.schema,
                           max_examples=self.max_examples)
        write_into(self.out.tensors, result.params, self.names)
        return {"ok": True, "num_examples": result.num_examples,
                "metrics": dict(result.metrics)}

    def evaluate(self, request: Mapping[str, Any]) -> dict[str, Any]:
        config = fit_config(request["config"])
        params = (self.fitted if request.get("buffer") == "out" else self.params).reset()
        result = check_eval(self.learner.evaluate(params, config))
        return {"ok": True, "loss": result.loss, "num_examples": result.num_examples,
                "metrics": dict(result.metrics)}


def serve(fd_in: int, fd_out: int) -> int:
    try:
        init = receive(fd_in)
    except PeerGoneError:
        return 0
    try:
        worker = Worker(init)
    except Exception as exc:  # noqa: BLE001 - the user's module or factory: say so, exit
        send(fd_out, raised(exc))
        return 1
    send(fd_out, {"ok": True, "pid": os.getpid()})
    while True:
        try:
            request = receive(fd_in)
        except PeerGoneError:
            return 0  # the daemon closed the pipe or died: nothing left to serve
        op = request.get("op")
        if op == "stop":
            return 0
        try:
            if op == "fit":
                answer = worker.fit(request)
            elif op == "evaluate":
                answer = worker.evaluate(request)
            else:
                answer = {"ok": False, "reason": Refusal.MALFORMED.value,
                          "detail": f"unknown request {bounded(str(op), 40)}"}
        except LearnerError as exc:
            answer = refused(exc)
        except Exception as exc:  # noqa: BLE001 - the user's fit or evaluate raised
            answer = raised(exc)
        try:
            send(fd_out, answer)
        except PeerGoneError:
            return 0


def main(argv: list[str]) -> int:
    # Ctrl-C in a terminal reaches the whole process group: the daemon stops its worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.dup2(2, 1)  # what the learner prints goes to stderr, never into the protocol
    fd_in, fd_out = int(argv[1]), int(argv[2])
    return serve(fd_in, fd_out)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
