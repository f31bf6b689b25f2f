"""``[learner]`` (peerd.daemon.config_learner): its keys, what they require of each other and
of the other sections, and every mistake as one line and exit status 2 from `peerd run`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.daemon.config import ConfigError, load_config, loads_config
from peerd.daemon.config_learner import KINDS
from peerd.learn.learner.contract import LearnerKind
from peerd.learn.learner.fleet import DeviceError, build_fleet_model, resolve_device
from peerd.learn.tasks import TaskError
from tests.daemon.test_config import FLEET, doc, write

PY = {"kind": "python", "entry": "tests.learn.learners:Scripted",
      "model": "tests.learn.learners:model"}


def test_the_kinds_are_the_contract_s() -> None:
    assert tuple(k.value for k in LearnerKind) == KINDS


def test_defaults_are_the_builtin_learner() -> None:
    lc = loads_config(doc()).learner
    assert (lc.kind, lc.entry, lc.model, lc.device, lc.timeout_s) == (
        "builtin", None, None, "auto", 600.0)
    assert (dict(lc.run_config), dict(lc.node_config)) == ({}, {})
    assert not lc.runs_worker


def test_a_python_learner_with_its_tables(tmp_path: Path) -> None:
    path = write(tmp_path, FLEET + '[learner]\nkind = "python"\n'
                 'entry = "tests.learn.learners:Scripted"\nmodel = "tests.learn.learners:model"\n'
                 'device = "cpu"\ntimeout_s = 2.5\n'
                 '[learner.run_config]\n"local-epochs" = 1\nlr = 0.01\nopt = "adamw"\n'
                 '[learner.node_config]\n"partition-id" = 3\nfast = true\n')
    lc = load_config(path).learner
    assert (lc.kind, lc.device, lc.timeout_s) == ("python", "cpu", 2.5)
    assert lc.runs_worker
    assert dict(lc.run_config) == {"local-epochs": 1, "lr": 0.01, "opt": "adamw"}
    assert dict(lc.node_config) == {"partition-id": 3, "fast": True}


@pytest.mark.parametrize(("learner", "message"), [
    ({"kind": "jax"}, "[learner] kind: must be one of builtin, python, flower, external"),
    ({"kind": "python", "model": PY["model"]}, "[learner] entry: required with kind = "
                                               '"python"'),
    ({"kind": "flower", "entry": PY["entry"]}, "[learner] model: required with kind = "
                                               '"flower"'),
    ({"entry": PY["entry"]}, '[learner] entry: only with kind = "python" or "flower", not '
                             '"builtin"'),
    ({**PY, "entry": "no colon"}, "[learner] entry: must be package.module:attr"),
    ({**PY, "model": "pkg:"}, "[learner] model: must be package.module:attr"),
    ({**PY, "device": "tpu"}, "[learner] device: must be auto, cpu, cuda, cuda:N or mps"),
    ({**PY, "timeout_s": 0}, "[learner] timeout_s: must be a finite number > 0"),
    ({**PY, "timeout_s": -1.0}, "[learner] timeout_s: must be a finite number > 0"),
    ({**PY, "timout_s": 5}, "[learner] timout_s: unknown key"),
    ({**PY, "run_config": {"x": {"nested": 1}}}, "[learner.run_config] x: must be a boolean, "
                                                  "a finite number or a string, got a table"),
    ({**PY, "node_config": {"ids": [1, 2]}}, "[learner.node_config] ids: must be a boolean, "
                                              "a finite number or a string, got a list"),
    ({**PY, "run_config": {"x": float("nan")}}, "[learner.run_config] x: must be a boolean"),
    ({**PY, "run_config": {f"k{i}": i for i in range(65)}}, "[learner.run_config]: at most "
                                                             "64 keys"),
    ({**PY, "run_config": "x"}, "[learner.run_config] must be a table"),
    ({**PY, "python": "python3"}, "[learner] python: must be the absolute path of a python "
                                  "interpreter"),
    ({**PY, "python": "/nonexistent/bin/python"}, "[learner] python: /nonexistent/bin/python "
                                                  "is not an executable file"),
    ({"python": "/usr/bin/env"}, '[learner] python: only with kind = "python" or "flower"'),
])
def test_bad_learner_settings_name_the_key(learner: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        loads_config(doc(learner=learner))
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("sections", "message"), [
    ({"learning": {"mode": "knowledge"}},
     '[learner] kind: "python" trains weight mode\'s local step; [learning] mode = '
     '"knowledge"'),
    ({"learning": {"local_policy": "fedbss"}},
     '[learning] local_policy: "fedbss" is the builtin learner\'s curriculum'),
    ({"task": {"name": "digits"}}, '[task]: not used with [learner] kind = "python"'),
])
def test_a_learner_of_the_user_s_needs_weight_mode_plain_and_no_task(
        sections: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        loads_config(doc(learner=PY, **sections))
    assert str(err.value).startswith(message)
    # The builtin learner runs with all of them as before.
    loads_config(doc(learner={"kind": "builtin"}, **sections))


def test_the_builtin_learner_takes_a_device_in_weight_mode_only() -> None:
    for device in ("cuda", "cuda:1", "mps", "cpu", "auto"):
        assert loads_config(doc(learner={"device": device})).learner.device == device
    with pytest.raises(ConfigError) as err:
        loads_config(doc(learner={"device": "cuda"}, learning={"mode": "knowledge"}))
    assert str(err.value) == ('[learner] device: "cuda" is for weight mode\'s local step; '
                              '[learning] mode = "knowledge" trains on the CPU')
    loads_config(doc(learner={"device": "auto"}, learning={"mode": "knowledge"}))


def test_the_worker_may_run_under_another_interpreter() -> None:
    assert loads_config(doc(learner={**PY, "python": sys.executable})).learner.python == (
        sys.executable)
    assert loads_config(doc(learner=PY)).learner.python is None


def test_external_needs_the_model_and_nothing_of_a_worker() -> None:
    lc = loads_config(doc(learner={"kind": "external", "model": PY["model"],
                                   "device": "cpu"})).learner
    assert (lc.kind, lc.model, lc.entry, lc.runs_worker) == ("external", PY["model"], None,
                                                             False)
    with pytest.raises(ConfigError, match=r'^\[learner\] model: required with kind = '
                                          r'"external"'):
        loads_config(doc(learner={"kind": "external"}))
    for key, value in (("entry", PY["entry"]), ("python", sys.executable), ("timeout_s", 5)):
        with pytest.raises(ConfigError, match=rf'^\[learner\] {key}: not used with kind = '
                                              r'"external"'):
            loads_config(doc(learner={"kind": "external", "model": PY["model"], key: value}))


def test_an_external_config_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = write(tmp_path, FLEET + '[learner]\nkind = "external"\nmodel = "m:f"\n'
                'entry = "m:g"\n')
    result = CliRunner().invoke(app, ["run", "--config", str(bad)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f'peerd: {bad}: [learner] entry: not used with kind = '
                                     '"external" (the training process is the user\'s own; it '
                                     "attaches to the daemon's learner socket)")


def test_peerd_run_stops_with_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = write(tmp_path, FLEET + '[learner]\nkind = "python"\nmodel = "m:f"\n')
    result = CliRunner().invoke(app, ["run", "--config", str(bad)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f'peerd: {bad}: [learner] entry: required with kind = '
                                     '"python" (the learner (or its factory), '
                                     "package.module:attr)")


def test_devices_resolve_on_this_machine_or_are_refused() -> None:
    import torch

    assert resolve_device("cpu") == "cpu"
    has_cuda = torch.cuda.is_available()
    assert resolve_device("auto") == ("cuda:0" if has_cuda else "cpu")
    if has_cuda:
        assert resolve_device("cuda") == "cuda:0"
    else:
        with pytest.raises(DeviceError, match='"cuda" asked for, but torch sees no CUDA'):
            resolve_device("cuda")
    with pytest.raises(DeviceError, match='"cuda:999" asked for'):
        resolve_device("cuda:999")


def test_the_fleet_model_is_built_seeded_and_leaves_the_global_rng_alone() -> None:
    import torch

    torch.manual_seed(1234)
    before = torch.random.get_rng_state()
    a = build_fleet_model("tests.learn.learners:model")
    assert torch.equal(torch.random.get_rng_state(), before)
    b = build_fleet_model("tests.learn.learners:model")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 b.state_dict().values(), strict=True))
    with pytest.raises(TaskError, match="cannot load it"):
        build_fleet_model("tests.learn.no_such:model")
    with pytest.raises(TaskError, match=r"returned int, not an nn\.Module"):
        build_fleet_model("tests.learn.learners:ROWS.bit_length")
