"""`peerd sim --attack`: each attack's published vector, the attackers' draw, honest-only
accuracy, and that ``--attack none`` is the run it always was."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.sim import runner
from peerd.sim.attacks import (
    Attack,
    Threat,
    alie_z,
    attacker_set,
    flipped_labels,
    parse_attack,
    threat_of,
)
from peerd.sim.output import summary_json
from peerd.sim.runner import SimConfig, run
from peerd.sim.train import evaluate
from tests.sim.test_runner import TINY

# Three agents, two parameters; agent 1 attacks. x̄ (the blends trained from) and the honest
# training results x give the updates Δ = x − x̄ = [1, 2], [1, 2], [2, 0].
ANCHORS = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
TRAINED = torch.tensor([[1.0, 2.0], [2.0, 3.0], [4.0, 2.0]])


def threat(text: str, *, seed: int = 0) -> Threat:
    return Threat(parse_attack(text), np.array([1]), agents=3, seed=seed)


def published(text: str, t: int = 0) -> torch.Tensor:
    out = threat(text).publish(TRAINED, ANCHORS, t)
    # Honest agents publish what they trained, bit for bit.
    assert torch.equal(out[[0, 2]], TRAINED[[0, 2]])
    return out[1]


def test_sign_flip_publishes_the_negated_scaled_update() -> None:
    # x̄ − s·Δ = [1, 1] − 4·[1, 2]; with s = 1: [1, 1] − [1, 2].
    assert published("sign-flip").tolist() == [-3.0, -7.0]
    assert published("sign-flip:1").tolist() == [0.0, -1.0]


def test_ipm_publishes_minus_epsilon_times_the_honest_mean_update() -> None:
    # Honest mean update: ([1, 2] + [2, 0]) / 2 = [1.5, 1]; [1, 1] − 0.1·[1.5, 1].
    assert published("ipm") == pytest.approx(torch.tensor([0.85, 0.9]))
    assert published("ipm:2") == pytest.approx(torch.tensor([-2.0, -1.0]))


def test_alie_publishes_mean_minus_z_std_of_honest_updates() -> None:
    # Honest updates [1, 2], [2, 0]: mean [1.5, 1], population std [0.5, 1].
    assert published("alie:1") == pytest.approx(torch.tensor([2.0, 1.0]))
    # n = 3, m = 1: s = ⌊3/2 + 1⌋ − 1 = 1, z = Φ⁻¹(2/3) = 0.4307.
    z = alie_z(3, 1)
    assert z == pytest.approx(0.43073, abs=1e-5)
    assert published("alie") == pytest.approx(torch.tensor([2.5 - 0.5 * z, 2.0 - z]))


def test_alie_z_matches_the_papers_example() -> None:
    # Baruch et al. 2019: n = 50 workers, m = 24 corrupted → s = 2, z = Φ⁻¹(0.96) ≈ 1.75.
    assert alie_z(50, 24) == pytest.approx(1.7507, abs=1e-4)
    assert alie_z(20, 4) == pytest.approx(0.38532, abs=1e-5)  # s = 7, Φ⁻¹(0.65)


def test_gaussian_noise_has_the_honest_update_scale_and_is_seeded() -> None:
    d = 20_000
    anchors = torch.zeros(3, d)
    trained = torch.full((3, d), 3.0)  # every update has per-coordinate RMS 3
    t = threat("gaussian")
    a = t.publish(trained, anchors, 4)
    assert torch.equal(a[[0, 2]], trained[[0, 2]])
    noise = a[1] - anchors[1]
    assert float(noise.mean()) == pytest.approx(0.0, abs=0.1)
    assert float(noise.std()) == pytest.approx(3.0, rel=0.03)
    assert torch.equal(t.publish(trained, anchors, 4), a)  # same (seed, round): same noise
    assert not torch.equal(t.publish(trained, anchors, 5), a)
    doubled = threat("gaussian:2").publish(trained, anchors, 4)[1]
    assert torch.allclose(doubled, 2 * noise)


def test_label_flip_poisons_training_not_publishing() -> None:
    assert torch.equal(threat("label-flip").publish(TRAINED, ANCHORS, 0), TRAINED)
    y = torch.tensor([0, 1, 2, 3, 9])
    parts = [np.array([0, 1]), np.array([2, 3, 4])]
    assert flipped_labels(y, parts, np.array([1]), 10).tolist() == [0, 1, 7, 6, 0]
    assert y.tolist() == [0, 1, 2, 3, 9]  # a copy


def test_none_publishes_the_trained_tensor_itself() -> None:
    t = Threat(Attack("none"), np.array([], dtype=np.int64), agents=3, seed=0)
    assert t.publish(TRAINED, ANCHORS, 0) is TRAINED
    assert t.honest_rows(TRAINED) is TRAINED


def test_attackers_are_a_seeded_subset() -> None:
    a = attacker_set(20, 0.2, seed=3)
    assert len(a) == 4
    assert list(a) == sorted(set(a.tolist()))
    assert a.max() < 20
    assert np.array_equal(a, attacker_set(20, 0.2, seed=3))
    assert any(not np.array_equal(a, attacker_set(20, 0.2, seed=s)) for s in range(4, 8))
    assert len(attacker_set(20, 0.0, seed=3)) == 0


@pytest.mark.parametrize(("text", "fraction", "message"), [
    ("bogus", 0.2, "unknown attack 'bogus'"),
    ("sign-flip:x", 0.2, "is not a number"),
    ("ipm:-1", 0.2, "must be finite and > 0"),
    ("label-flip:2", 0.2, "takes no parameter"),
    ("sign-flip", 1.0, r"in \[0, 1\)"),
    ("sign-flip", -0.1, r"in \[0, 1\)"),
    ("sign-flip", math.nan, r"in \[0, 1\)"),
    ("sign-flip", 0.01, "is no agent"),
    ("sign-flip", 0.0, "needs --attackers"),
    ("none", 0.2, "--attackers needs an --attack"),
])
def test_bad_threats_are_refused(text: str, fraction: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        threat_of(text, fraction, 20, 0)
    with pytest.raises(ValueError, match=message):
        SimConfig(agents=20, attack=text, attackers=fraction).validate()


def _evaluated(monkeypatch: pytest.MonkeyPatch, cfg: SimConfig) -> list[torch.Tensor]:
    """Run ``cfg``; every matrix the runner evaluated, in order."""
    seen: list[torch.Tensor] = []
    real = evaluate  # the real one, not a spy an earlier call left in place

    def spy(model: Any, matrix: torch.Tensor, *args: Any, **kwargs: Any) -> np.ndarray:
        seen.append(matrix.clone())
        return real(model, matrix, *args, **kwargs)

    monkeypatch.setattr(runner, "evaluate", spy)
    run(cfg)
    return seen


def test_accuracy_is_over_honest_agents_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # Isolated agents blend nothing, so honest models are the attack-free run's, and the
    # attackers' wildly flipped models must not be evaluated at all.
    cfg = replace(TINY, algorithms=("isolated",))
    clean = _evaluated(monkeypatch, cfg)
    attacked_cfg = replace(cfg, attack="sign-flip:1000", attackers=0.25)
    attacked = _evaluated(monkeypatch, attacked_cfg)
    honest = attacked_cfg.threat().honest
    assert len(honest) == 6
    assert len(attacked) == len(clean) == TINY.rounds
    for a, c in zip(attacked, clean, strict=True):
        assert torch.equal(a, c[torch.from_numpy(honest)])
    doc = summary_json(run(attacked_cfg))
    assert doc["config"]["attacker_count"] == 2
    assert doc["config"]["attack"] == "sign-flip:1000"


def test_an_attack_moves_the_honest_blends() -> None:
    cfg = replace(TINY, algorithms=("cached-dfl",))
    clean = summary_json(run(cfg))["results"]["cached-dfl"]["curve"]
    flipped = summary_json(run(replace(cfg, attack="sign-flip", attackers=0.25)))
    assert flipped["results"]["cached-dfl"]["curve"] != clean


def test_attack_none_is_the_run_without_the_attack_code(monkeypatch: pytest.MonkeyPatch) -> None:
    # The attack layer bypassed entirely vs in place with `none`: bit for bit the same.
    with_layer = summary_json(run(TINY))
    monkeypatch.setattr(Threat, "publish", lambda self, trained, anchors, t: trained)
    monkeypatch.setattr(Threat, "honest_rows", lambda self, matrix: matrix)
    without = summary_json(run(TINY))
    assert with_layer["results"] == without["results"]
    assert with_layer["config"]["attacker_count"] == 0


@pytest.mark.parametrize(("args", "message"), [
    (["--attack", "bogus", "--attackers", "0.2"], "unknown attack 'bogus'"),
    (["--attack", "sign-flip", "--attackers", "1.0"], "fraction in [0, 1)"),
    (["--attack", "sign-flip"], "needs --attackers"),
    (["--attackers", "0.2"], "--attackers needs an --attack"),
    (["--attack", "ipm", "--attackers", "0.2", "--algorithms", "fedcache"],
     "--attack applies to weight runs"),
])
def test_cli_refuses_bad_attacks_in_one_line(tmp_path: Path, args: list[str],
                                             message: str) -> None:
    res = CliRunner().invoke(app, ["sim", *args, "--out", str(tmp_path)])
    assert res.exit_code == 2
    assert message in res.output
    assert len(res.output.strip().splitlines()) == 1
