"""`peerd sim cordial`: §6.1's problem generation, a tiny linear run where cordial agents beat
isolated ones, the Pairwise-10 composites and stacked agents, and the CLI (--json shape, bad
options exit 2 with one line)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.core import cordial as cl
from peerd.learn import linearproblem as lp
from peerd.learn import pairwise10 as pw
from peerd.sim import cordial_linear as lin
from peerd.sim.cordial_mnist import run_pairwise10


def test_correlation_draw_is_a_correlation_matrix_and_repairs_when_needed() -> None:
    repaired = 0
    for k in range(40):
        r, fixed = lp.draw_correlation(8, np.random.default_rng(k))
        repaired += fixed
        assert np.allclose(np.diag(r), 1.0)
        assert np.allclose(r, r.T)
        assert np.linalg.eigvalsh(r).min() >= -1e-10
        if not fixed:
            assert np.abs(r - np.eye(8)).max() <= 5 / 8
    # The paper: the repair was needed in about 60% of the runs with N = 8, none with N = 32.
    assert 10 <= repaired <= 35
    assert not any(lp.draw_correlation(32, np.random.default_rng(k))[1] for k in range(10))


def test_laplace_correlation_matches_monte_carlo() -> None:
    rng = np.random.default_rng(0)
    z1, z2 = rng.standard_normal((2, 400_000))
    r = np.array([[1.0, 0.6], [0.6, 1.0]])
    got = lp.laplace_correlation(r)
    assert got[0, 0] == 1.0
    assert got[0, 1] == got[1, 0]
    mapped = lp._laplace_of_gauss(np.stack([z1, 0.6 * z1 + 0.8 * z2]))
    assert mapped.var(1) == pytest.approx([1.0, 1.0], abs=0.01)  # unit-variance Laplace
    assert got[0, 1] == pytest.approx(float(np.mean(mapped[0] * mapped[1])), abs=0.006)
    assert got[0, 1] < 0.6  # the mapping weakens the correlation
    assert lp.laplace_correlation(np.zeros((2, 2)))[0, 1] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("dist", ["gaussian", "laplace"])
def test_problem_satisfies_assumption_1_and_the_kappa_scaling(dist: str) -> None:
    p = lp.make_problem(6, dist, runs=3, seed=1)
    off = 1 - torch.eye(6, dtype=torch.float64)
    gamma = (p.lam_star.abs()[..., 0, 0] * p.cov.transpose(1, 2).abs() * off).sum(-1)
    assert (gamma <= 0.8 + 1e-12).all()
    torch.testing.assert_close(p.b, torch.einsum("rijab,rjbd->rijad", p.lam_star, p.a_star))
    torch.testing.assert_close(cl.optimal_isolated(p.a, p.b, p.cov), p.a_star)
    assert cl.cordial_loss(p.a_star, p.lam_star, p.a, p.b, p.cov).abs().max() < 1e-12
    # The inputs have the covariance the losses assume (sampled with 50,000 draws).
    x = p.sample(50_000, torch.Generator().manual_seed(0))[0]  # [B, N, d]
    emp = torch.einsum("bjd,bid->ji", x, x) / (50_000 * 2)
    assert (emp - p.cov[0]).abs().max() < 0.03


def test_a_tiny_linear_run_cordial_beats_isolated() -> None:
    c = lin.run_linear(4, "gaussian", runs=4, iterations=1500, seed=3)
    s = lin.summarise(c)
    assert c.cordial.shape == (4, len(c.points))
    assert c.points[-1] == 1500
    assert (c.cordial[:, -1] < 0.2 * c.best_isolated).all()  # below the best isolated loss
    assert (c.isolated[:, -1] < 1.1 * c.best_isolated).all()  # isolated SGD converged
    assert s["lower_from_140_on"] == 4
    assert s["median_ratio_final"] < 0.2
    assert s["slope"] < -0.2
    again = lin.run_linear(4, "gaussian", runs=4, iterations=1500, seed=3)
    assert np.array_equal(again.cordial, c.cordial)  # seeded


def test_pairwise_tuples_follow_the_two_rules() -> None:
    for n in (2, 4, 6, 8):
        t = pw.pairwise_tuples(n)
        assert t.shape == (9, n)
        assert t.min() >= 1
        assert t.max() <= 9
        assert (t[:, 0::2] + t[:, 1::2] == 10).all()  # (1,2), (3,4), …
        assert (t[:, 1:-1:2] + t[:, 3::2] == 10).all()  # (2,4), (4,6), …
        assert len({tuple(r) for r in t}) == 9
    assert pw.pairwise_tuples(6)[0].tolist() == [1, 9, 9, 1, 1, 9]


def test_draw_uses_disjoint_pools_and_the_test_split() -> None:
    rng = np.random.default_rng(0)
    labels = {"train": rng.integers(0, 10, 3000), "test": rng.integers(0, 10, 600)}
    # Image k carries its own index, so the composites can be traced back to their pools.
    images = {s: torch.arange(len(v), dtype=torch.float32)[:, None, None].expand(-1, 28, 28)
              for s, v in labels.items()}
    d = pw.make_draw(4, 5, 0, images, labels)
    ids = {s: d.x[s][:, :, 0, 0].long() for s in ("train", "val", "test")}
    assert ids["train"].shape == (45, 4)
    for s, src in (("train", "train"), ("val", "train"), ("test", "test")):
        assert (torch.from_numpy(labels[src])[ids[s]] == d.y[s]).all()
    train, val = set(ids["train"].flatten().tolist()), set(ids["val"].flatten().tolist())
    assert not train & val
    assert len(train) <= 45


def test_stacked_agents_receive_constants_and_start_without_messages() -> None:
    gen = torch.Generator().manual_seed(0)
    model = pw.StackedAgents(seeds=2, n=3, dropout=0.0, cordial=True, gen=gen)
    x = torch.randn(5, 6, 28, 28, generator=gen)
    assert torch.equal(model(x), model(x, messages=False))  # Λ, c start at zero
    with torch.no_grad():
        model.lam.normal_(generator=gen)
    out = model(x)
    assert not torch.allclose(out, model(x, messages=False))
    # Agent 0's loss moves its own layers and its coordination layer, never a peer's
    # embedding: the received h_j are constants (Algorithm 1).
    out[:, 0].sum().backward()
    assert model.f2w.grad is not None
    assert model.lam.grad is not None
    assert model.f2w.grad[0].abs().sum() > 0
    assert model.f2w.grad[1:].abs().sum() == 0
    assert model.lam.grad[0, 0].abs().sum() > 0
    assert model.lam.grad[0, 1:].abs().sum() == 0
    assert model.c1w.grad is not None
    assert model.c1w.grad[6:].abs().sum() == 0


def test_cli_json_shape(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sim", "cordial", "--agents", "4,6", "--distributions",
                                      "gaussian", "--runs", "2", "--iterations", "150",
                                      "--out", str(tmp_path), "--no-plots", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary == json.loads((tmp_path / "cordial-linear.json").read_text())
    assert summary["experiment"] == "linear"
    assert [(c["n"], c["distribution"], c["runs"]) for c in summary["configs"]] == [
        (4, "gaussian", 2), (6, "gaussian", 2)]
    for c in summary["configs"]:
        assert 0.0 < c["median_ratio_final"] <= c["max_ratio_final"]
        assert 0 <= c["lower_at_20"] <= 2
        assert 0 <= c["lower_from_140_on"] <= 2
    rows = (tmp_path / "cordial-linear.csv").read_text().splitlines()
    assert rows[0].startswith("n,distribution,iteration,cordial_median")
    assert not (tmp_path / "cordial-linear.png").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--experiment", "nonlinear"], "--experiment must be one of linear, pairwise10"),
        (["--agents", "1"], "--agents: each N must be in 2..256"),
        (["--agents", "4,x"], "--agents: comma list of integers"),
        (["--distributions", "cauchy"], "--distributions: comma list of gaussian, laplace"),
        (["--runs", "0"], "--runs must be in 1..10000"),
        (["--iterations", "0"], "--iterations must be in 1..10000000"),
        (["--experiment", "pairwise10", "--agents", "3"], "Pairwise-10 needs an even N"),
        (["--experiment", "pairwise10", "--methods", "fedavg"], "--methods: comma list"),
        (["--threads", "0"], "--threads must be at least 1"),
    ],
)
def test_bad_options_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["sim", "cordial", *args])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: ")
    assert message in lines[0]


def test_pairwise10_run_shape_on_synthetic_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    # Synthetic "MNIST": digit k is a constant image of value k/9 - 0.5, so the run is fast
    # and needs no dataset; the summary's shape and the per-run table are what is checked.
    rng = np.random.default_rng(1)
    labels = {"train": np.repeat(np.arange(10), 12), "test": np.repeat(np.arange(10), 6)}
    images = {s: torch.from_numpy(v / 9.0 - 0.5).float()[:, None, None].expand(-1, 28, 28)
              + 0.01 * torch.from_numpy(rng.standard_normal((len(v), 28, 28))).float()
              for s, v in labels.items()}
    monkeypatch.setattr(pw, "load_images", lambda: (images, labels))
    seen: list[str] = []
    summary = run_pairwise10((2,), 3, 6, 2, 0, ("isolated", "cordial"),
                                lambda label, k: seen.append(label))
    assert [(c["n"], c["method"], c["runs"]) for c in summary["configs"]] == [
        (2, "isolated", 2), (2, "cordial", 2)]
    assert seen.count("N=2 cordial") == 6
    for c in summary["configs"]:
        assert len(c["test_loss"]) == 2
        assert all(0.0 <= a <= 1.0 for a in c["test_accuracy"])
        assert c["paper_median_test_loss"] is None  # P = 3 is not the paper's table
    cordial = summary["configs"][1]
    assert cordial["test_accuracy_messages_removed"] is not None
    assert summary["configs"][0]["test_accuracy_messages_removed"] is None
