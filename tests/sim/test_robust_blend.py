"""`peerd sim --blend`: the robust rules run through the same core round as the daemon's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.core.alpha import AlphaPolicy
from peerd.core.plan import BlendPlan
from peerd.core.robust import Krum, Median, robust_blend_rows
from peerd.sim.algorithms import Contacts, make_fleet
from peerd.sim.output import summary_json
from peerd.sim.runner import SimConfig, run
from tests.sim.test_runner import TINY


def test_bad_blend_is_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="krum:f needs an integer"):
        SimConfig(blend="krum:x").validate()
    with pytest.raises(ValueError, match="unknown blend rule"):
        SimConfig(blend="mean").validate()


def test_clipping_with_a_huge_tau_is_the_weighted_blend() -> None:
    # τ far above any update: every weight stays α, so the runs agree (up to the order of
    # float32 sums: one product for all agents vs one per agent).
    cfg = replace(TINY, algorithms=("cached-dfl", "dfl"))
    plain = summary_json(run(cfg))["results"]
    clipped = summary_json(run(replace(cfg, blend="clipped:1e9")))["results"]
    for alg in cfg.algorithms:
        assert clipped[alg]["final_accuracy_mean"] == pytest.approx(
            plain[alg]["final_accuracy_mean"], abs=0.02)


def test_a_median_run_is_deterministic_and_differs_from_weighted() -> None:
    cfg = replace(TINY, algorithms=("cached-dfl",), blend="median")
    a, b = summary_json(run(cfg)), summary_json(run(cfg))
    assert a == b
    assert a["config"]["blend"] == "median"
    curve = a["results"]["cached-dfl"]["curve"]
    assert curve != summary_json(run(replace(cfg, blend="weighted")))["results"]["cached-dfl"][
        "curve"]


def test_the_dfl_fleets_robust_blend_is_the_core_rule_per_agent() -> None:
    g = torch.Generator().manual_seed(0)
    init = torch.randn(5, 7, generator=g)
    fleet = make_fleet("dfl", init, [10] * 5, policy=AlphaPolicy.parse("uniform"),
                       capacity=4, tau_max=2)
    met = np.ones((5, 5), dtype=bool)
    np.fill_diagonal(met, False)
    trained = torch.randn(5, 7, generator=g)
    fleet.publish(trained, 1, Contacts([], met))
    plans = [BlendPlan((f"a{a}", *(f"p{j}" for j in range(4))), (0.2,) * 5) for a in range(5)]
    fleet.blend_robust(plans, Median())
    for a in range(5):
        rows = [a, *(j for j in range(5) if j != a)]
        assert torch.equal(fleet.matrix[a], robust_blend_rows(trained[rows], [0.2] * 5,
                                                              Median()))
    before = fleet.matrix.clone()
    fleet.blend_robust(plans, Krum(2))  # 5 models ≤ 2·2 + 2: every agent keeps its model
    assert torch.equal(fleet.matrix, before)


def test_cli_blend_flag(tmp_path: Path) -> None:
    bad = CliRunner().invoke(app, ["sim", "--blend", "krum:x", "--out", str(tmp_path)])
    assert bad.exit_code == 2
    assert "krum:f needs an integer" in bad.output
    fedcache = CliRunner().invoke(app, ["sim", "--algorithms", "fedcache", "--blend", "median",
                                        "--out", str(tmp_path)])
    assert fedcache.exit_code == 2
    assert "--blend applies to weight runs" in fedcache.output
    ok = CliRunner().invoke(app, [
        "sim", "--agents", "6", "--rounds", "2", "--local-steps", "2", "--capacity", "4",
        "--algorithms", "cached-dfl", "--blocks", "2", "--round-interval-s", "20",
        "--blend", "clipped:2.0", "--out", str(tmp_path / "run"), "--no-plots", "--json"])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert doc["config"]["blend"] == "clipped:2.0"
    assert 0.0 <= doc["results"]["cached-dfl"]["final_accuracy_mean"] <= 1.0
