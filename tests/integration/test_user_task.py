"""docs/tasks.md's example, for real: two `peerd run` daemons on loopback train the user task
in examples/peerd_signals (a custom model over a folder of files), swap entries, and the
trained model comes out with `peerd export` and predicts with the documented snippet."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import time
from pathlib import Path

import pytest
from safetensors import safe_open
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.control.status import Status
from peerd.mesh.localmesh import MeshNode, local_mesh

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs" / "tasks.md"
TASK = "peerd_signals.task:task"
ROUNDS = 3
#: Start-up imports torch and libp2p on a loaded 2-core machine; then a few 1 s rounds.
TIMEOUT_S = 180.0

pytestmark = pytest.mark.slow


def wait_until_both_did_rounds_and_hold_each_other(mesh: list[MeshNode]) -> list[Status]:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        statuses = [n.poll() for n in mesh]
        if all(s is not None and s.node.round >= ROUNDS and
               {c.origin for c in s.cache} == {o.id for o in mesh} - {n.id}
               for n, s in zip(mesh, statuses, strict=True)):
            return [s for s in statuses if s is not None]
        for n in mesh:
            assert n.alive(), f"node{n.index} exited ({n.exit_code()}):\n" + "\n".join(n.tail(40))
        time.sleep(0.5)  # polling a daemon's status: it has no event to wait on from here
    logs = "\n".join(f"--- node{n.index}\n" + "\n".join(n.tail(30)) for n in mesh)
    raise AssertionError(f"no {ROUNDS} rounds with full caches in {TIMEOUT_S:.0f} s\n{logs}")


def test_two_daemons_train_the_example_task_and_the_model_comes_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    # Imported by name: examples/ is not installed (a user's package would not be either).
    write = importlib.import_module("peerd_signals.make_data").write

    data = [tmp_path / "signals" / f"node{i}" for i in range(2)]
    # Non-IID: node 0 never sees noise, node 1 never sees sine.
    write(data[0], per_class=25, seed=0, classes=("sine", "square"))
    write(data[1], per_class=25, seed=1, classes=("square", "noise"))
    env = [{"PYTHONPATH": str(EXAMPLES), "PEERD_SIGNALS_DIR": str(d)} for d in data]
    learning: dict[str, object] = {"round_interval_s": 1.0, "local_steps": 5, "lr": 0.05}
    with local_mesh(tmp_path / "mesh", 2, task=TASK, use_netns=False, learning=learning,
                    env=env) as mesh:
        statuses = wait_until_both_did_rounds_and_hold_each_other(mesh)
    for s in statuses:
        assert s.config.task == TASK
        assert s.node.val_accuracy is not None
        assert s.node.examples is not None
        assert s.node.examples > 0
    node0 = mesh[0]

    # The model out: node 0's own (as published last), then node 1's from node 0's cache.
    runner = CliRunner()
    monkeypatch.setenv("PEERD_SIGNALS_DIR", str(data[1]))  # the snippet predicts node 1's data
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    result = runner.invoke(app, ["export", "-c", str(node0.config), "--out",
                                 "signals.safetensors", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["origin"], summary["task"], summary["own"]) == (node0.id, TASK, True)
    assert int(summary["version"]) >= 1
    with safe_open("signals.safetensors", framework="pt") as f:
        assert f.metadata()["payload_sha256"] == summary["payload_sha256"]
        assert sorted(f.keys()) == ["conv1.bias", "conv1.weight", "conv2.bias", "conv2.weight",
                                    "head.bias", "head.weight"]
    cached = runner.invoke(app, ["export", "-c", str(node0.config), "--origin", mesh[1].id[-6:],
                                 "--out", "peer.safetensors"])
    assert cached.exit_code == 0, cached.output

    # The documented snippet predicts with the exported model.
    text = DOCS.read_text()
    match = re.search(r"```python\n(.*?)```", text[text.index("<!-- tasks-snippet"):], re.S)
    assert match is not None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(match.group(1), "docs/tasks.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    assert lines[0].startswith("predicted [")
    accuracy = float(lines[1].removeprefix("accuracy "))
    assert 0.0 <= accuracy <= 1.0

    # ONNX: SignalNet traces (conv, relu, mean, linear).
    onnx_out = runner.invoke(app, ["export", "-c", str(node0.config), "--format", "onnx",
                                   "--out", "signals.onnx"])
    assert onnx_out.exit_code == 0, onnx_out.output
    assert (work / "signals.onnx").stat().st_size > 0
