"""The FedCache simulation: test splits with the training label mix, MAUA, the traffic
formulas, and knowledge mode through the core round (tiny runs on scikit-learn's digits)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from peerd.learn.data import load_dataset, partition
from peerd.sim import knowledge_data
from peerd.sim.fedcache_forms import DEFAULT_FORMS, OLD_FORMS, PAPER_FORMS, describe, forms_of
from peerd.sim.knowledge import (
    F16,
    KnowledgeSimConfig,
    client_test_split,
    knowledge_cli,
    run_knowledge,
)
from peerd.sim.maua import CURVE_COLUMNS, MAUA_DEFINITION


def test_each_client_tests_on_its_own_label_mix() -> None:
    data = load_dataset("digits")
    y_tr, y_te = data.y_train.numpy(), data.y_test.numpy()
    parts = partition(y_tr, 5, "dirichlet:0.5", np.random.default_rng(0))
    tests = client_test_split(parts, y_tr, y_te, np.random.default_rng(1))
    assert sorted(np.concatenate(tests).tolist()) == list(range(len(y_te)))  # a partition
    for train, test in zip(parts, tests, strict=True):
        p_train = np.bincount(y_tr[train], minlength=10) / len(train)
        p_test = np.bincount(y_te[test], minlength=10) / max(len(test), 1)
        assert set(np.flatnonzero(p_test)) <= set(np.flatnonzero(p_train))
        assert np.abs(p_train - p_test).sum() < 0.5


CONFIG = KnowledgeSimConfig(dataset="digits", agents=6, rounds=3, models="mixed", lr=0.05,
                            batch_size=8, r=4, key_dim=16,
                            algorithms=("fedcache", "isolated", "cached-dfl"))


#: The forms the docs' older runs were measured with (mean epoch, no round-1 knowledge, ...).
OLD = replace(CONFIG, **OLD_FORMS)


@pytest.fixture(scope="module")
def result_summary() -> dict[str, Any]:
    return run_knowledge(CONFIG).summary()


@pytest.fixture(scope="module")
def old_summary() -> dict[str, Any]:
    return run_knowledge(replace(OLD, algorithms=("fedcache", "isolated"))).summary()


def test_maua_is_the_best_rounds_mean_accuracy(result_summary: dict[str, Any]) -> None:
    assert result_summary["curve_columns"] == list(CURVE_COLUMNS)
    assert result_summary["maua_definition"] == MAUA_DEFINITION
    for alg in CONFIG.algorithms:
        curve = result_summary["curves"][alg]
        assert [row[0] for row in curve] == [1, 2, 3]
        assert result_summary["maua"][alg] == max(row[1] for row in curve)
        bests = [row[2] for row in curve]
        assert bests == sorted(bests)  # a best-so-far mean never falls
        assert all(row[2] >= row[1] - 1e-12 for row in curve)  # best >= current
        assert result_summary["mean_of_client_best"][alg] == bests[-1]
        assert 0.1 < result_summary["maua"][alg] <= bests[-1] <= 1.0


def test_a_client_without_test_images_is_left_out_of_the_metrics(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = knowledge_data.client_test_split

    def without_client_0(*args: Any) -> list[np.ndarray]:
        tests = real(*args)
        return [np.zeros(0, np.int64), *tests[1:]]

    monkeypatch.setattr(knowledge_data, "client_test_split", without_client_0)
    config = replace(CONFIG, agents=3, rounds=2, algorithms=("fedcache", "cached-dfl"))
    summary = run_knowledge(config).summary()
    for alg in config.algorithms:
        curve = summary["curves"][alg]
        assert all(math.isfinite(row[1]) and math.isfinite(row[2]) for row in curve)
        assert summary["maua"][alg] == max(row[1] for row in curve)
        assert math.isfinite(summary["mean_of_client_best"][alg])


def test_knowledge_traffic_is_keys_once_and_logits_per_round(
        result_summary: dict[str, Any]) -> None:
    data = load_dataset("digits")
    samples, classes, k = data.x_train.shape[0], 10, CONFIG.agents
    keys = samples * (CONFIG.key_dim * F16 + 1)
    logits = samples * classes * F16
    index = samples * 4  # an int32 per row
    traffic = result_summary["traffic_bytes"]
    # Server-equivalent: keys with their indices up once, logits with their indices up every
    # round, teachers down every round (round 1: eq. 9's zeros). Gossip: keys once (a keys
    # entry's row is its id), logits with their int32 ids every round.
    assert traffic["fedcache"]["server_equivalent"] == (keys + index + 3 * (logits + index)
                                                        + 3 * logits)
    assert traffic["fedcache"]["gossip_all_to_all"] == (k - 1) * (keys + 3 * (logits + index))
    assert traffic["isolated"] == {"server_equivalent": 0, "gossip_all_to_all": 0}
    moved = traffic["cached-dfl"]["models_moved"]
    params = result_summary["info"]["cached-dfl"]["parameters"]["large"]
    assert moved > 0
    assert traffic["cached-dfl"]["exchanged"] == moved * params * 4


def test_the_old_forms_count_logits_only_and_skip_round_1(old_summary: dict[str, Any]) -> None:
    data = load_dataset("digits")
    samples, classes = data.x_train.shape[0], 10
    keys = samples * (CONFIG.key_dim * F16 + 1)
    logits = samples * classes * F16
    # Keys up once, logits up every round, teachers down from round 2 on; no index counted.
    assert old_summary["traffic_bytes"]["fedcache"]["server_equivalent"] == (keys + 3 * logits
                                                                            + 2 * logits)
    assert old_summary["traffic_bytes"]["fedcache"]["gossip_all_to_all"] == (
        (CONFIG.agents - 1) * (keys + 3 * logits))
    curves = old_summary["curves"]
    # Round 1 has no teachers (an empty cache): fedcache trains exactly like isolated.
    assert curves["fedcache"][0] == [1, curves["isolated"][0][1], curves["isolated"][0][2],
                                     curves["fedcache"][0][3]]
    steps = old_summary["info"]["local_steps_per_round"]
    assert steps == math.ceil(data.x_train.shape[0] / CONFIG.agents / 8)
    assert old_summary["config"]["distill_form"] == "code"
    assert old_summary["config"]["temperature"] == 3.0  # T unset: the code form's


def test_one_local_epoch_is_each_clients_own(result_summary: dict[str, Any]) -> None:
    data = load_dataset("digits")
    parts = partition(data.y_train, CONFIG.agents, "dirichlet:1.0",
                      np.random.default_rng(np.random.SeedSequence(0).spawn(3)[0]))
    steps = result_summary["info"]["local_steps_per_round"]
    assert steps == [math.ceil(len(p) / 8) for p in parts]
    assert len(set(steps)) > 1  # the split is uneven, so the counts differ
    assert result_summary["info"]["cached-dfl"]["local_epoch"] == "mean"


def test_acc_at_is_the_first_round_reaching_each_target(
        result_summary: dict[str, Any]) -> None:
    for alg, hits in result_summary["acc_at"].items():
        curve = result_summary["curves"][alg]
        assert set(hits) == {"0.6", "0.7"}
        for target, hit in hits.items():
            reached = [r for r in curve if r[1] >= float(target)]
            if not reached:
                assert hit is None
                continue
            assert hit == {"round": reached[0][0], "bytes": reached[0][3]}


def test_distillation_changes_what_the_clients_learn(result_summary: dict[str, Any]) -> None:
    curves = result_summary["curves"]
    # Eq. 9: round 1 already distils (towards zero logits, a uniform τ), so it differs.
    assert curves["fedcache"][0][1] != curves["isolated"][0][1]
    assert [r[1] for r in curves["fedcache"][1:]] != [r[1] for r in curves["isolated"][1:]]
    assert result_summary["info"]["fedcache"]["parameters"] == {
        "small": 64 * 96 + 96 + 96 * 10 + 10,
        "medium": 64 * 192 + 192 + 192 * 96 + 96 + 96 * 10 + 10,
        "large": 64 * 256 + 256 + 256 * 192 + 192 + 192 * 64 + 64 + 64 * 10 + 10,
    }


def test_the_cli_entry_writes_its_json_and_refuses_bad_input(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    common = dict(dataset="digits", agents=3, rounds=1, algorithms=("fedcache",),
                  models="small", lr=0.05, batch_size=8, beta=1.5, temperature=3.0, r=2,
                  key_dim=8, seed=0, eval_every=1, capacity=3, tau_max=5.0, round_seconds=10,
                  out=tmp_path, json_output=True)
    knowledge_cli(partition="dirichlet:1.0", **common)  # type: ignore[arg-type]
    written = json.loads((tmp_path / "fedcache.json").read_text())
    assert written["config"]["agents"] == 3
    assert "fedcache" in written["maua"]
    assert "fedcache" in written["mean_of_client_best"]
    with pytest.raises(SystemExit) as exc:
        knowledge_cli(partition="shards", **common)  # type: ignore[arg-type]
    assert exc.value.code == 2
    assert "dirichlet" in capsys.readouterr().err


def test_bad_configs_are_refused() -> None:
    for bad in (dict(algorithms=("fedavg",)), dict(models="huge"), dict(agents=1),
                dict(beta=-1.0), dict(r=0), dict(distill_form="kd"), dict(local_epoch="two"),
                dict(round1_knowledge="random"), dict(index_bytes=3), dict(targets=(1.5,))):
        with pytest.raises(ValueError, match=r"algorithm|model|agents|beta|r must|--"):
            KnowledgeSimConfig(**bad).validate()


def test_a_run_names_its_forms_and_an_old_config_reads_as_the_old_forms(
        result_summary: dict[str, Any], old_summary: dict[str, Any]) -> None:
    assert forms_of(result_summary["config"]) == DEFAULT_FORMS
    assert forms_of(old_summary["config"]) == OLD_FORMS
    bare = {k: v for k, v in result_summary["config"].items() if k not in PAPER_FORMS}
    assert forms_of(bare) == OLD_FORMS  # a config written before the keys existed
    assert describe(bare) == describe(old_summary["config"])
    assert "eq. 18" in describe(result_summary["config"])
    assert result_summary["config"]["temperature"] == 1.0  # recorded as in force, not unset
    assert "code (CE" in describe({**result_summary["config"], "distill_form": "code"})
    assert "32-bit index" in describe(result_summary["config"])
