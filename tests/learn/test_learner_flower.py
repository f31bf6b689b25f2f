"""Flower learners: an unchanged Flower app (examples/flower_app, Message API) and legacy
``NumPyClient`` apps run behind the learner contract (peerd.learn.learner.flower)."""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("flwr", reason="the flower extra is not installed: pip install -e '.[flower]'")

from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.client import Client, NumPyClient
from flwr.clientapp import ClientApp

from peerd.learn.learner.contract import (
    FitConfig,
    Learner,
    LearnerContext,
    LearnerError,
    Refusal,
)
from peerd.learn.learner.flower import flower_learner, flower_node_id

APP_DIR = Path(__file__).resolve().parents[2] / "examples" / "flower_app"
NODE = "12D3KooWExampleNodeForFlowerTests"
PARTITIONS = 3


def fit_config(round: int = 1, rho: float = 0.01, **kw: Any) -> FitConfig:
    values: dict[str, Any] = {
        "round": round, "rho": rho, "steps": 5, "seed": 1234, "device": "cpu",
        "batch_size": 16, "lr": 0.1,
    }
    values.update(kw)
    return FitConfig(**values)


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


@pytest.fixture
def flowerapp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The example app's package, imported as Flower imports it (its project dir on the
    path), and dropped again so that no test sees another's module state."""
    monkeypatch.syspath_prepend(str(APP_DIR))
    importlib.import_module("flowerapp.client_app")
    importlib.import_module("flowerapp.task")

    yield sys.modules["flowerapp"]
    for name in [m for m in sys.modules if m == "flowerapp" or m.startswith("flowerapp.")]:
        del sys.modules[name]


# --- (a) the example app, unchanged --------------------------------------------------------


def test_the_quickstart_shaped_app_learns_behind_the_contract(flowerapp: Any) -> None:
    task = flowerapp.task
    ctx = LearnerContext(
        node_id=NODE, device="cpu",
        node_config={"partition-id": 1, "num-partitions": PARTITIONS},
        run_config={"local-epochs": 2, "batch-size": 32},
    )
    learner = flower_learner(flowerapp.client_app.app, ctx)
    assert isinstance(learner, Learner)
    assert not learner.legacy
    torch.manual_seed(0)
    params = state_of(task.Net())
    trainloader, valloader = task.load_data(1, PARTITIONS, 32)

    before = learner.evaluate(params, fit_config())
    assert before.num_examples == len(valloader.dataset)
    assert 0.0 <= before.metrics["accuracy"] <= 1.0
    for r in range(1, 6):
        result = learner.fit(params, params, fit_config(round=r))
        assert result.num_examples == len(trainloader.dataset)
        assert math.isfinite(result.metrics["train_loss"])
        assert list(result.params) == list(params)
        assert all(result.params[k].dtype == params[k].dtype for k in params)
        assert all(result.params[k].shape == params[k].shape for k in params)
        assert any(not torch.equal(result.params[k], params[k]) for k in params)
        params = dict(result.params)
    after = learner.evaluate(params, fit_config(round=5))
    assert after.loss < before.loss
    assert after.metrics["accuracy"] > before.metrics["accuracy"]
    assert "eval_loss" not in after.metrics
    assert "num-examples" not in after.metrics


def test_the_example_is_a_flower_project_the_flower_cli_can_load() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((APP_DIR / "pyproject.toml").read_text())
    components = project["tool"]["flwr"]["app"]["components"]
    for ref in (components["clientapp"], components["serverapp"]):
        module, attr = ref.split(":")
        assert (APP_DIR / (module.replace(".", "/") + ".py")).is_file()
        assert attr == "app"


# --- (e) what reaches the app --------------------------------------------------------------


class Recorder:
    """A Message-API app that keeps what it was given and adds ``step`` to every array."""

    def __init__(self, step: float = 1.0) -> None:
        self.step = step
        self.seen: list[tuple[Message, Context]] = []
        self.fail_next = False
        self.app = ClientApp()
        self.app.train()(self._train)
        self.app.evaluate()(self._evaluate)

    def _count(self, context: Context) -> int:
        counter = context.state.config_records.get("counter", ConfigRecord({"calls": 0}))
        calls = cast(int, counter["calls"]) + 1
        context.state["counter"] = ConfigRecord({"calls": calls})
        return calls

    def _train(self, msg: Message, context: Context) -> Message:
        self.seen.append((msg, context))
        calls = self._count(context)
        if self.fail_next:
            raise RuntimeError("disk full")
        state = msg.content.array_records["arrays"].to_torch_state_dict()
        trained = {k: v + self.step if v.is_floating_point() else v for k, v in state.items()}
        metrics = MetricRecord({"num-examples": 40, "train_loss": 0.5, "calls": calls})
        return Message(
            RecordDict({"arrays": ArrayRecord(trained), "metrics": metrics}), reply_to=msg
        )

    def _evaluate(self, msg: Message, context: Context) -> Message:
        self.seen.append((msg, context))
        metrics = MetricRecord({"loss": 0.25, "accuracy": 0.8, "num-examples": 10})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)


def context(**kw: Any) -> LearnerContext:
    return LearnerContext(
        node_id=NODE, device="cpu", node_config={"partition-id": 2}, run_config={"epochs": 3},
        **kw,
    )


def test_round_rho_and_the_fleet_settings_reach_the_app_config() -> None:
    rec = Recorder()
    learner = flower_learner(rec.app, context())
    params = state_of(nn.Linear(3, 2))
    learner.fit(params, params, fit_config(round=7, rho=0.25, steps=9, seed=2**64 - 5,
                                           batch_size=12, lr=0.03, device="cuda:1"))
    msg, ctx = rec.seen[-1]
    config = msg.content["config"]
    assert config["server-round"] == 7
    assert config["proximal-mu"] == 0.25
    assert config["lr"] == 0.03
    assert config["local-steps"] == 9
    assert config["batch-size"] == 12
    assert config["seed"] == (2**64 - 5) % 2**63
    assert config["device"] == "cuda:1"
    assert msg.metadata.message_type == "train"
    assert msg.metadata.group_id == "7"
    assert dict(ctx.node_config) == {"partition-id": 2}
    assert dict(ctx.run_config) == {"epochs": 3}
    assert ctx.node_id == flower_node_id(NODE)
    sent = msg.content.array_records["arrays"].to_torch_state_dict()
    assert all(torch.equal(sent[k], params[k]) for k in params)


def test_the_context_state_persists_across_rounds_but_not_through_a_failure() -> None:
    rec = Recorder()
    learner = flower_learner(rec.app, context())
    params = state_of(nn.Linear(3, 2))
    assert learner.fit(params, params, fit_config(round=1)).metrics["calls"] == 1
    assert learner.fit(params, params, fit_config(round=2)).metrics["calls"] == 2
    rec.fail_next = True
    with pytest.raises(LearnerError) as err:
        learner.fit(params, params, fit_config(round=3))
    assert err.value.reason is Refusal.RAISED
    assert "disk full" in err.value.detail
    rec.fail_next = False
    # The failed round's increment was not kept, as Flower's runtime keeps no state then.
    assert learner.fit(params, params, fit_config(round=4)).metrics["calls"] == 3


# --- (d) what comes back -------------------------------------------------------------------


class WithBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)


def test_fit_returns_new_params_in_the_models_keys_and_dtypes() -> None:
    rec = Recorder(step=0.5)
    learner = flower_learner(rec.app, context())
    params = state_of(WithBuffers())
    result = learner.fit(params, params, fit_config())
    assert list(result.params) == list(params)
    for key, tensor in params.items():
        got = result.params[key]
        assert got.dtype == tensor.dtype
        assert got.shape == tensor.shape
        if tensor.is_floating_point():
            assert torch.allclose(got, tensor + 0.5)
        else:  # num_batches_tracked, an int64 buffer, comes back as it went
            assert torch.equal(got, tensor)
    assert result.num_examples == 40
    assert result.metrics == {"train_loss": 0.5, "calls": 1.0}

    evaluated = learner.evaluate(params, fit_config())
    assert (evaluated.loss, evaluated.num_examples) == (0.25, 10)
    assert evaluated.metrics == {"accuracy": 0.8}
    assert rec.seen[-1][0].metadata.message_type == "evaluate"


def replying(content: RecordDict | Error, *, evaluate: bool = False) -> ClientApp:
    app = ClientApp()

    def handler(msg: Message, context: Context) -> Message:
        if isinstance(content, Error):
            return Message(content, reply_to=msg)
        return Message(content, reply_to=msg)

    (app.evaluate() if evaluate else app.train())(handler)
    return app


def test_numpy_arrays_of_another_float_width_and_positional_names_are_the_models() -> None:
    params = state_of(nn.Linear(3, 2))
    arrays = [v.numpy().astype(np.float64) * 2 for v in params.values()]
    app = replying(RecordDict({
        "arrays": ArrayRecord(arrays),
        "metrics": MetricRecord({"num-examples": 3}),
    }))
    result = flower_learner(app, context()).fit(params, params, fit_config())
    assert all(result.params[k].dtype == torch.float32 for k in params)
    assert all(torch.allclose(result.params[k], params[k] * 2) for k in params)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (RecordDict({"metrics": MetricRecord({"num-examples": 3})}), Refusal.MALFORMED),
        (RecordDict({"arrays": ArrayRecord([np.zeros(2)])}), Refusal.MALFORMED),
        (RecordDict({"arrays": ArrayRecord({"weight": ArrayRecord([np.zeros(2)])["0"]}),
                     "metrics": MetricRecord({"num-examples": 3})}), Refusal.SCHEMA),
        (RecordDict({"arrays": ArrayRecord([np.zeros((2, 3)), np.zeros(2)]),
                     "metrics": MetricRecord({"loss": 1.0})}), Refusal.MALFORMED),
        (RecordDict({"arrays": ArrayRecord([np.zeros((2, 3)), np.zeros(2)]),
                     "metrics": MetricRecord({"num-examples": 2.5})}), Refusal.EXAMPLES),
        (Error(code=0, reason="ClientApp crashed"), Refusal.RAISED),
    ],
    ids=["no-arrays", "no-metrics", "foreign-names", "no-num-examples", "fractional",
         "error-reply"],
)
def test_a_bad_train_reply_is_refused_with_a_reason(
    content: RecordDict | Error, reason: Refusal
) -> None:
    params = state_of(nn.Linear(3, 2))
    with pytest.raises(LearnerError) as err:
        flower_learner(replying(content), context()).fit(params, params, fit_config())
    assert err.value.reason is reason


def test_an_evaluate_reply_without_a_loss_is_malformed() -> None:
    app = replying(RecordDict({"metrics": MetricRecord({"eval_acc": 0.5, "num-examples": 3})}),
                   evaluate=True)
    with pytest.raises(LearnerError) as err:
        flower_learner(app, context()).evaluate(state_of(nn.Linear(3, 2)), fit_config())
    assert err.value.reason is Refusal.MALFORMED


def test_an_app_that_returns_no_message_is_malformed() -> None:
    app = ClientApp()
    app.train()(cast(Any, lambda msg, context: msg.content))
    params = state_of(nn.Linear(3, 2))
    with pytest.raises(LearnerError) as err:
        flower_learner(app, context()).fit(params, params, fit_config())
    assert err.value.reason is Refusal.MALFORMED


# --- (c) an app that raises ----------------------------------------------------------------


def test_an_app_whose_train_raises_fails_the_round_as_raised() -> None:
    def train(msg: Message, context: Context) -> Message:
        raise ValueError("CUDA error: device-side assert triggered")

    app = ClientApp()
    app.train()(train)
    params = state_of(nn.Linear(3, 2))
    with pytest.raises(LearnerError) as err:
        flower_learner(app, context()).fit(params, params, fit_config())
    assert err.value.reason is Refusal.RAISED
    assert "ValueError: CUDA error" in err.value.detail


def test_an_app_without_an_evaluate_handler_raises() -> None:
    rec = Recorder()
    app = ClientApp()
    app.train()(rec._train)
    with pytest.raises(LearnerError) as err:
        flower_learner(app, context()).evaluate(state_of(nn.Linear(3, 2)), fit_config())
    assert err.value.reason is Refusal.RAISED


# --- (b) legacy NumPyClient apps -----------------------------------------------------------


class Legacy(NumPyClient):  # type: ignore[misc, unused-ignore]
    """Flower's legacy client: it moves every array by the round's lr."""

    def __init__(self, log: list[dict[str, Any]], partition: int, fail: bool = False) -> None:
        self.log = log
        self.partition = partition
        self.fail = fail

    def fit(self, parameters: list[np.ndarray[Any, Any]], config: dict[str, Any]) -> Any:
        self.log.append(dict(config))
        if self.fail:
            raise RuntimeError("out of memory")
        lr = float(config["lr"])
        moved = [p + lr if p.dtype.kind == "f" else p for p in parameters]
        return moved, 17 + self.partition, {"train_loss": 0.7, "note": "text"}

    def evaluate(self, parameters: list[np.ndarray[Any, Any]], config: dict[str, Any]) -> Any:
        self.log.append(dict(config))
        return float(np.sum(parameters[0])), 9, {"accuracy": 0.6}


def legacy_targets(log: list[dict[str, Any]], fail: bool = False) -> dict[str, object]:
    def client_fn(context: Context) -> Client:
        return Legacy(log, int(context.node_config["partition-id"]), fail).to_client()

    def numpy_client_fn(context: Context) -> NumPyClient:  # Flower warns but accepts it
        return Legacy(log, int(context.node_config["partition-id"]), fail)

    return {
        "client_fn": client_fn,
        "ClientApp(client_fn=)": ClientApp(client_fn=client_fn),
        "client_fn->NumPyClient": numpy_client_fn,
        "NumPyClient": Legacy(log, 2, fail),
    }


@pytest.mark.parametrize("kind", list(legacy_targets([])))
def test_a_legacy_numpy_client_trains_and_evaluates(kind: str) -> None:
    log: list[dict[str, Any]] = []
    learner = flower_learner(legacy_targets(log)[kind], context())
    assert learner.legacy
    params = state_of(WithBuffers())
    result = learner.fit(params, params, fit_config(round=4, rho=0.5, lr=0.25))
    assert log[-1]["server-round"] == 4
    assert log[-1]["proximal-mu"] == 0.5
    assert list(result.params) == list(params)
    for key, tensor in params.items():
        assert result.params[key].dtype == tensor.dtype
        want = tensor + 0.25 if tensor.is_floating_point() else tensor
        assert torch.equal(result.params[key], want)
    assert result.num_examples == 17 + 2
    assert result.metrics == {"train_loss": 0.7}  # the string metric is left out

    evaluated = learner.evaluate(params, fit_config(round=4))
    assert evaluated.loss == pytest.approx(float(params["fc.weight"].sum()))
    assert evaluated.num_examples == 9
    assert evaluated.metrics == {"accuracy": 0.6}


def test_a_legacy_client_that_raises_fails_the_round_as_raised() -> None:
    log: list[dict[str, Any]] = []
    learner = flower_learner(legacy_targets(log, fail=True)["client_fn"], context())
    params = state_of(nn.Linear(3, 2))
    with pytest.raises(LearnerError) as err:
        learner.fit(params, params, fit_config())
    assert err.value.reason is Refusal.RAISED
    assert "out of memory" in err.value.detail


def test_a_legacy_client_returning_too_few_arrays_is_a_schema_refusal() -> None:
    class Short(NumPyClient):  # type: ignore[misc, unused-ignore]
        def fit(self, parameters: list[Any], config: dict[str, Any]) -> Any:
            return parameters[:1], 1, {}

    params = state_of(nn.Linear(3, 2))
    with pytest.raises(LearnerError) as err:
        flower_learner(Short(), context()).fit(params, params, fit_config())
    assert err.value.reason is Refusal.SCHEMA


# --- what the entry may be -----------------------------------------------------------------


def test_an_entry_that_is_no_flower_app_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="ClientApp"):
        flower_learner(42, context())
    with pytest.raises(TypeError, match="client_fn"):
        flower_learner(lambda a, b: None, context())


def test_without_flwr_the_factory_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "flwr.client", None)
    with pytest.raises(ImportError, match=r"peerd\[flower\]"):
        flower_learner(object(), context())


def test_node_ids_are_stable_positive_int64() -> None:
    ids = {flower_node_id(f"12D3KooW{i}") for i in range(100)}
    assert len(ids) == 100
    assert all(0 < i < 2**63 for i in ids)
    assert flower_node_id(NODE) == flower_node_id(NODE)
