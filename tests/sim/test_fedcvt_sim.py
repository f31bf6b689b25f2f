"""`peerd sim fedcvt`: the two-party split, a tiny breast_cancer run through the CLI (--json
shape), bad options (exit 2, one line), seeded determinism, and the gate actually used."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.sim.fedcvt import FedCVTConfig, Views, load_views, run_one, split_people

TINY = FedCVTConfig(dataset="breast_cancer", aligned=0.2, steps=40, batch_size=32, hidden=16,
                    dim=8, warmup_steps=10)


@pytest.fixture(scope="module")
def views() -> Views:
    return load_views("breast_cancer")


def test_breast_cancer_views_are_the_feature_groups(views: Views) -> None:
    assert views.a_train.shape[1] == 20
    assert views.b_train.shape[1] == 10
    assert len(views.a_test) == len(views.b_test) == len(views.y_test)


def test_split_is_disjoint_and_sized_by_the_fraction() -> None:
    s = split_people(100, replace(TINY, aligned=0.3))
    assert len(s.aligned) == 30
    assert len(s.a_only) == 35
    assert len(s.b_only) == 35
    every = np.concatenate([s.aligned, s.a_only, s.b_only])
    assert sorted(every.tolist()) == list(range(100))
    with pytest.raises(ValueError, match="at least 2"):
        split_people(10, replace(TINY, aligned=0.1))


def test_a_run_is_deterministic_in_its_seed(views: Views) -> None:
    first = run_one(views, TINY, "fedcvt")
    assert run_one(views, TINY, "fedcvt") == first
    other = run_one(views, replace(TINY, seed=1), "fedcvt")
    assert other != first  # a different split and init


def test_the_gate_labels_b_only_rows_and_the_ablation_turns_it_off(views: Views) -> None:
    on = run_one(views, TINY, "fedcvt")
    assert on["pseudo_accepted_fraction"] is not None
    assert 0.0 < float(on["pseudo_accepted_fraction"]) <= 1.0
    off = run_one(views, replace(TINY, pseudo_labels=False), "fedcvt")
    assert off["pseudo_accepted_fraction"] is None
    assert "pseudo_accepted_fraction" not in run_one(views, TINY, "vanilla")


def test_the_default_attention_is_the_seeds_unsharpened_softmax(
        views: Views, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 28: softmax(QKᵀ/√d_k) as the seed writes it; the paper's code's T = 0.1 only
    # when asked for.
    import peerd.core.fedcvt
    import peerd.sim.fedcvt as sim

    seen: list[float | None] = []
    real = peerd.core.fedcvt.attention_fill

    def spy(*args: object, sharpen: float | None = None) -> object:
        seen.append(sharpen)
        return real(*args, sharpen=sharpen)  # type: ignore[arg-type]

    monkeypatch.setattr(sim, "attention_fill", spy)
    assert FedCVTConfig().sharpen == 0.0
    run_one(views, replace(TINY, steps=12), "fedcvt")
    assert seen
    assert set(seen) == {None}
    seen.clear()
    run_one(views, replace(TINY, steps=12, sharpen=0.1), "fedcvt")
    assert seen
    assert set(seen) == {0.1}


def test_cli_json_shape(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    result = CliRunner().invoke(app, ["sim", "fedcvt", "--dataset", "breast_cancer",
                                      "--aligned", "0.2,0.4", "--seeds", "0,1", "--steps", "20",
                                      "--hidden", "8", "--dim", "4", "--warmup-steps", "5",
                                      "--json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert json.loads(out.read_text()) == summary
    assert summary["aligned"] == [0.2, 0.4]
    assert summary["seeds"] == [0, 1]
    assert summary["config"]["sharpen"] == 0.0  # the seed's attention unless --sharpen
    assert [row["aligned"] for row in summary["table"]] == [0.2, 0.4]
    assert len(summary["runs"]) == 2 * 2 * 2  # fractions × seeds × methods
    for row in summary["table"]:
        for key in ("vanilla_mean", "vanilla_std", "fedcvt_mean", "fedcvt_std"):
            assert 0.0 <= row[key] <= 1.0
        assert row["gain_mean"] == pytest.approx(row["fedcvt_mean"] - row["vanilla_mean"])
    n_train = 427  # breast_cancer's seeded train split (peerd.learn.data)
    assert {r["n_aligned"] for r in summary["runs"] if r["aligned"] == 0.2} == {
        round(0.2 * n_train)}
    assert "peerd sim fedcvt: aligned 0.2 seed 0 vanilla" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--aligned", "0.1,abc"], "--aligned takes comma-separated numbers"),
        (["--aligned", "1.0"], "--aligned fractions must be in (0, 1)"),
        (["--seeds", "x"], "--seeds takes comma-separated integers"),
        (["--dataset", "digits"], "--dataset must be one of"),
        (["--threshold", "1.5"], "--threshold must be in [0, 1)"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--no-fill"], "--no-fill needs --no-pseudo-labels"),
    ],
)
def test_bad_options_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["sim", "fedcvt", *args])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: ")
    assert message in lines[0]
