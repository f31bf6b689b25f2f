"""`peerd sim --engine ray`: the same summary.json bytes as the local engine, for any workers.

The Ray tests start a 2-CPU local Ray cluster once (module fixture) and shut it down after;
they skip only when Ray is not installed (``pip install 'peerd[ray]'``; scripts/setup installs
it). The shard tests run without Ray.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.sim import rayengine
from peerd.sim.engine import LocalEngine, TrainSetup, TrainTask, shard_bounds
from peerd.sim.output import write_outputs
from peerd.sim.runner import SimConfig, SimResult, run

# Few agents, few rounds, a tiny model; shards of 2 agents so 7 agents make 4 shards (the last
# short) and 2 workers each get several.
SMALL = SimConfig(
    dataset="digits",
    partition="shards",
    agents=7,
    rounds=3,
    local_steps=2,
    batch_size=16,
    rho=0.01,
    eval_samples=120,
    algorithms=("cached-dfl", "dfl", "fedavg"),
    model="linear",
    shard_agents=2,
    seed=3,
)


def _summary_bytes(result: SimResult, out: Path) -> bytes:
    write_outputs(result, out, plots=False)
    return (out / "summary.json").read_bytes()


def test_shards_cover_every_agent_once() -> None:
    assert shard_bounds(7, 2) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert shard_bounds(3, 100) == [(0, 3)]
    with pytest.raises(ValueError, match="shard-agents"):
        shard_bounds(3, 0)
    with pytest.raises(ValueError, match="shard-agents"):
        SimConfig(shard_agents=0).validate()


def test_a_shard_trains_its_global_agents_on_their_batches() -> None:
    """Shard [2, 4) alone gives what the engine gives those agents, and what one vmap over the
    whole fleet gives them (to float tolerance: a different cut sums in another order)."""
    from peerd.learn.data import load_dataset, partition
    from peerd.learn.models import build_model
    from peerd.sim.engine import shard_threads, train_shard
    from peerd.sim.train import draw_batches, train_batched

    data = load_dataset("digits")
    parts = partition(data.y_train, 4, "shards", np.random.default_rng(0))
    model = build_model("linear", data.input_shape, data.num_classes, seed=0)
    setup = TrainSetup(model, data.x_train, data.y_train, parts)
    matrix = 0.01 * torch.randn(4, setup.schema.flat_size,
                                generator=torch.Generator().manual_seed(1))
    task = TrainTask(mode="batched", round_index=2, seed=5, steps=2, batch_size=8, lr=0.1,
                     rho=0.0)
    engine = LocalEngine()
    engine.load(setup, shard_agents=2)
    whole, losses = engine.train(task, matrix)
    with shard_threads():
        rows, shard_losses = train_shard(setup, task, 2, matrix[2:4])
    assert torch.equal(rows, whole[2:4])
    assert torch.equal(shard_losses, losses[2:4])
    batches = draw_batches(parts, 2, 8, seed=5, round_index=2)
    fleet, _ = train_batched(model, matrix, setup.schema, data.x_train, data.y_train, batches,
                             lr=0.1, rho=0.0)
    torch.testing.assert_close(whole, fleet)
    assert not torch.equal(whole, matrix)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[ModuleType]:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install 'peerd[ray]'; scripts/setup installs it)")
    ray = importlib.import_module("ray")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # CPU only: no GPU tip
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def test_ray_gives_the_local_summary_bytes_for_1_and_2_workers(
    ray_cluster: ModuleType, tmp_path: Path
) -> None:
    local = run(SMALL)
    expected = _summary_bytes(local, tmp_path / "local")
    assert local.info["engine"] == "local"
    for workers in (1, 2):
        with rayengine.RayEngine(workers=workers) as engine:
            result = run(SMALL, engine=engine)
        assert result.info["engine"] == "ray"
        assert result.info["workers"] == workers
        assert _summary_bytes(result, tmp_path / f"ray{workers}") == expected
    assert ray_cluster.is_initialized()  # the engine leaves a Ray it did not start running


def test_ray_per_agent_loop_matches_local(ray_cluster: ModuleType, tmp_path: Path) -> None:
    cfg = replace(SMALL, batched=False, algorithms=("cached-dfl",), rounds=2)
    expected = _summary_bytes(run(cfg), tmp_path / "local")
    with rayengine.RayEngine(workers=2) as engine:
        got = _summary_bytes(run(cfg, engine=engine), tmp_path / "ray")
    assert got == expected


def test_cli_engine_ray_writes_the_local_summary(ray_cluster: ModuleType, tmp_path: Path) -> None:
    common = ["sim", "--dataset", "digits", "--agents", "5", "--rounds", "2", "--local-steps",
              "2", "--batch-size", "16", "--model", "linear", "--eval-samples", "100",
              "--algorithms", "cached-dfl,dfl", "--shard-agents", "2", "--no-plots"]
    runner = CliRunner()
    local = runner.invoke(app, [*common, "--out", str(tmp_path / "local")])
    assert local.exit_code == 0, local.output
    ray = runner.invoke(app, [*common, "--engine", "ray", "--workers", "2",
                              "--out", str(tmp_path / "ray")])
    assert ray.exit_code == 0, ray.output
    assert ((tmp_path / "ray" / "summary.json").read_bytes()
            == (tmp_path / "local" / "summary.json").read_bytes())


def test_engine_ray_without_ray_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = importlib.util.find_spec

    def no_ray(name: str, *args: object) -> object:
        return None if name == "ray" else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", no_ray)
    result = CliRunner().invoke(app, ["sim", "--engine", "ray", "--agents", "3", "--rounds",
                                      "1", "--out", str(tmp_path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert "pip install 'peerd[ray]'" in lines[0]
    assert not (tmp_path / "summary.json").exists()


def test_ray_engine_without_ray_raises_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def no_ray(name: str, package: str | None = None) -> ModuleType:
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", no_ray)
    with pytest.raises(RuntimeError, match=r"pip install 'peerd\[ray\]'"):
        rayengine.RayEngine()


def test_unreachable_address_is_one_line_and_exit_2(tmp_path: Path) -> None:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install 'peerd[ray]'; scripts/setup installs it)")
    import socket

    with socket.socket() as sock:  # a port nothing listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        result = CliRunner().invoke(app, ["sim", "--engine", "ray", "--address",
                                          f"127.0.0.1:{port}", "--agents", "3", "--rounds",
                                          "1", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: cannot reach Ray at 127.0.0.1:{port}: [Errno 111] Connection refused"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine", "spark"], "--engine must be local or ray"),
        (["--workers", "2"], "apply to --engine ray"),
        (["--engine", "ray", "--algorithms", "fedcache"], "weight runs"),
        (["--engine", "ray", "--address", "nowhere"], "--address must be HOST:PORT"),
    ],
)
def test_bad_engine_options_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sim", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert message in result.output
