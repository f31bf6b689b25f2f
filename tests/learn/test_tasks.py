"""Tasks: packaged datasets split per node, CSV files re-read every round, users' own tasks."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from torch import nn

from peerd.core.alpha import AlphaPolicy
from peerd.core.local_update import LossName
from peerd.core.staleness import Clock
from peerd.learn.tasks import CsvTask, DatasetTask, TaskData, TaskError, load_task
from peerd.learn.trainer import RoundInput, drift_to, run_round


def write_csv(path: Path, rows: list[tuple[object, ...]], header: str = "a,b,label") -> None:
    path.write_text(header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))


def test_digits_parts_of_one_fleet_are_disjoint_and_cover_the_training_set() -> None:
    parts = [load_task("digits", partition_spec="shards", node_index=i, node_count=3, seed=1)
             for i in range(3)]
    assert all(isinstance(p, DatasetTask) for p in parts)
    sizes = [len(p.data().y_train) for p in parts]
    total = load_task("digits", partition_spec="iid", node_count=1).data().y_train
    # equal-size shards may leave a remainder of a few rows unassigned, never more
    assert 0.99 * len(total) <= sum(sizes) <= len(total)
    rows = [{tuple(r.tolist()) for r in p.data().X_train} for p in parts]
    assert not (rows[0] & rows[1])
    assert not (rows[1] & rows[2])
    # all nodes evaluate on the same full test set, so accuracies are comparable
    assert torch.equal(parts[0].data().X_val, parts[2].data().X_val)
    # and build the same initial model: blending needs a common starting point
    a, b = parts[0].model().state_dict(), parts[1].model().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_node_index_outside_the_fleet_is_refused() -> None:
    with pytest.raises(TaskError):
        load_task("digits", node_index=3, node_count=3)


def test_csv_is_reread_every_round_so_new_rows_are_used(tmp_path: Path) -> None:
    write_csv(tmp_path / "day1.csv", [(i, i % 3, i % 2) for i in range(40)])
    task = load_task("csv", csv_glob=str(tmp_path / "*.csv"), csv_features=("a", "b"))
    first = task.data()
    write_csv(tmp_path / "day2.csv", [(i, 1, i % 2) for i in range(40, 100)])
    second = task.data()
    assert len(first.y_train) + len(first.y_val) == 40
    assert len(second.y_train) + len(second.y_val) == 100
    # a row's split is stable across re-reads (hash of the row, not of its position)
    assert set(first.X_val[:, 0].tolist()) <= set(second.X_val[:, 0].tolist())
    assert 0 < len(second.y_val) < 50


def test_csv_malformed_and_non_finite_rows_are_skipped_not_fatal(tmp_path: Path) -> None:
    write_csv(tmp_path / "d.csv", [(1, 2, 0), ("x", 2, 1), (3, "nan", 1), (4, 5, 1), (6, 7)])
    data = load_task("csv", csv_glob=str(tmp_path / "d.csv")).data()
    # (6, 7) lacks its label; with no row held out, validation falls back to the train rows
    assert data.X_train.tolist() == [[1.0, 2.0], [4.0, 5.0]]
    assert data.y_train.tolist() == [0, 1]


def test_csv_default_features_are_all_columns_but_the_label(tmp_path: Path) -> None:
    write_csv(tmp_path / "d.csv", [(i, -i, i % 2) for i in range(20)])
    task = load_task("csv", csv_glob=str(tmp_path / "d.csv"))
    assert isinstance(task, CsvTask)
    model = task.model()
    assert isinstance(model, nn.Module)
    assert task.features == ("a", "b")


@pytest.mark.parametrize("name", ["csv", "digits"])
def test_building_a_model_leaves_the_global_rng_as_it_was(tmp_path: Path, name: str) -> None:
    write_csv(tmp_path / "d.csv", [(i, -i, i % 2) for i in range(20)])
    task = load_task(name, csv_glob=str(tmp_path / "d.csv"))
    task.data()
    before = torch.random.get_rng_state()
    first = task.model().state_dict()
    assert torch.equal(torch.random.get_rng_state(), before)
    # ... and the model still starts from the fleet-wide seed, whatever the caller's state.
    torch.manual_seed(12345)
    second = task.model().state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)
    torch.random.set_rng_state(before)


def test_csv_regression_uses_mse_and_float_targets(tmp_path: Path) -> None:
    write_csv(tmp_path / "r.csv", [(i, 2 * i, 0.5 * i) for i in range(30)], header="a,b,y")
    task = load_task("csv", csv_glob=str(tmp_path / "r.csv"), csv_label="y",
                     csv_kind="regression")
    assert task.loss == "mse"
    assert task.data().y_train.dtype == torch.float32


def test_csv_problems_have_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="no CSV files"):
        load_task("csv", csv_glob=str(tmp_path / "none*.csv")).data()
    write_csv(tmp_path / "d.csv", [(1, 2, 0)], header="a,b,target")
    with pytest.raises(TaskError, match="missing columns"):
        load_task("csv", csv_glob=str(tmp_path / "d.csv"), csv_features=("a",)).data()
    write_csv(tmp_path / "neg.csv", [(1, 2, -1)])
    with pytest.raises(TaskError, match="integers >= 0"):
        load_task("csv", csv_glob=str(tmp_path / "neg.csv")).data()


class Toy:
    name = "toy"
    loss: LossName = "cross_entropy"

    def model(self) -> nn.Module:
        torch.manual_seed(0)
        return nn.Linear(2, 2)

    def data(self) -> TaskData:
        X = torch.tensor([[0.0, 1.0], [1.0, 0.0]] * 8)
        y = torch.tensor([0, 1] * 8)
        return TaskData(X, y, X, y)


def make_toy() -> Toy:
    return Toy()


def test_a_users_own_task_by_module_path() -> None:
    task = load_task("tests.learn.test_tasks:make_toy")
    assert task.name == "toy"
    with pytest.raises(TaskError):
        load_task("tests.learn.test_tasks:nothing_here")
    with pytest.raises(TaskError):
        load_task("no-such-task")


def test_a_round_blends_the_cache_trains_and_reports() -> None:
    from peerd.core.entry import CacheItem, Entry

    task = Toy()
    model = task.model()
    peer = Entry.create(origin="peer", version=1, created_at=90.0, num_examples=16,
                        params={k: torch.zeros_like(v) for k, v in model.state_dict().items()})
    inp = RoundInput(own_id="me", cache=(CacheItem(peer.meta, "peer", 95.0),), peers=[peer],
                     clock=Clock.time(100.0), policy=AlphaPolicy.parse("uniform"), steps=20,
                     batch_size=4, lr=0.5, rho=0.0, seed=0)
    out = run_round(model, task, inp)
    assert out.alpha == {"me": 0.5, "peer": 0.5}
    assert out.examples == 16
    assert out.val_accuracy == 1.0
    assert inp.peers == []  # consumed once blended: the round pins no cache entry
    assert drift_to(out.params, [peer])["peer"] > 0
    assert out.publish  # nothing published yet: the first goes
    assert out.moved == float("inf")


@pytest.mark.parametrize(("epsilon", "publish"), [(0.0, True), (1e-3, True), (1e9, False)])
def test_the_round_publishes_only_a_model_that_moved_more_than_epsilon(
    epsilon: float, publish: bool
) -> None:
    task = Toy()
    model = task.model()
    published = {k: v.detach().clone() for k, v in model.state_dict().items()}
    inp = RoundInput(own_id="me", cache=(), peers=[], clock=Clock.time(100.0),
                     policy=AlphaPolicy.parse("uniform"), steps=5, batch_size=4, lr=0.5,
                     rho=0.0, seed=0, epsilon=epsilon, published=published,
                     model_is_published=True)
    out = run_round(model, task, inp)
    assert 1e-3 < out.moved < 1e9  # trained away from the published model, measured from it
    assert out.publish is publish
    assert out.alpha == {"me": 1.0}


@pytest.mark.parametrize(("silent_for_s", "publish"), [(100.0, False), (300.0, True)])
def test_a_quiet_model_is_republished_once_its_entry_is_max_silence_old(
    silent_for_s: float, publish: bool
) -> None:
    # Issue 12, item 3: below ε the daemon's round stayed silent for ever (peers then drop
    # the node's last entry after τ_max); past max_silence_s it publishes the model anyway.
    task = Toy()
    model = task.model()
    published = {k: v.detach().clone() for k, v in model.state_dict().items()}
    inp = RoundInput(own_id="me", cache=(), peers=[], clock=Clock.time(1000.0),
                     policy=AlphaPolicy.parse("uniform"), steps=5, batch_size=4, lr=0.5,
                     rho=0.0, seed=0, epsilon=1e9, published=published,
                     model_is_published=True, silent_for_s=silent_for_s, max_silence_s=300.0)
    out = run_round(model, task, inp)
    assert out.moved < 1e9  # below ε: only the silence can make it publish
    assert out.publish is publish


@pytest.mark.parametrize("with_peer", [True, False])
def test_anchor_from_the_published_entry_trains_like_an_anchor_copy(with_peer: bool) -> None:
    # RoundInput.published lets x̄ be the published tensors instead of a copy when the
    # round has no peers; with peers x̄ is the blend. Either way, the same training.
    from peerd.core.entry import CacheItem, Entry

    task = Toy()
    a, b = task.model(), task.model()
    b.load_state_dict(a.state_dict())
    published = {k: v.detach().clone() for k, v in a.state_dict().items()}
    g = torch.Generator().manual_seed(4)
    peer = Entry.create(origin="peer", version=1, created_at=90.0, num_examples=16,
                        params={k: torch.randn(v.shape, generator=g)
                                for k, v in published.items()})
    cache = (CacheItem(peer.meta, "peer", 95.0),) if with_peer else ()
    base = dict(own_id="me", cache=cache, clock=Clock.time(100.0),
                policy=AlphaPolicy.parse("uniform"), steps=10, batch_size=4, lr=0.3, rho=5.0,
                seed=0)
    peers_a, peers_b = ([peer] if with_peer else []), ([peer] if with_peer else [])
    copies: list[object] = []

    def keep(x: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        copies.append(x)
        return {k: v.clone() for k, v in x.items()}

    out_a = run_round(a, task, RoundInput(**base, peers=peers_a,  # type: ignore[arg-type]
                                          published=published, model_is_published=True,
                                          keep_anchor=keep))
    out_b = run_round(b, task, RoundInput(**base, peers=peers_b))  # type: ignore[arg-type]
    for k in out_a.params:
        torch.testing.assert_close(out_a.params[k], out_b.params[k], rtol=1e-5, atol=1e-6)
    # ρ = 5 pulls hard: a wrong x̄ (e.g. the trained model, or the peer alone) would not match.
    assert out_a.alpha == out_b.alpha
    # Without peers the published tensors are x̄: no copy is kept. With peers, the blend is.
    assert len(copies) == (1 if with_peer else 0)


def test_a_spilled_anchor_trains_exactly_like_an_anchor_copy(tmp_path: Path) -> None:
    # The daemon keeps x̄ in an unlinked file (peerd.store.spool.spill) read one tensor at a time;
    # the arithmetic must be the very same as with x̄ cloned in memory.
    from peerd.core.entry import CacheItem, Entry
    from peerd.store import spool

    task = Toy()
    a, b = task.model(), task.model()
    b.load_state_dict(a.state_dict())
    g = torch.Generator().manual_seed(7)
    peer = Entry.create(origin="peer", version=1, created_at=90.0, num_examples=16,
                        params={k: torch.randn(v.shape, generator=g)
                                for k, v in a.state_dict().items()})
    base = dict(own_id="me", cache=(CacheItem(peer.meta, "peer", 95.0),),
                clock=Clock.time(100.0), policy=AlphaPolicy.parse("uniform"), steps=10,
                batch_size=4, lr=0.3, rho=5.0, seed=0)
    kept: list[object] = []

    def keep(x: object) -> object:
        kept.append(spool.spill(x, tmp_path))  # type: ignore[arg-type]
        return kept[-1]

    out_a = run_round(a, task, RoundInput(**base, peers=[peer],  # type: ignore[arg-type]
                                          keep_anchor=keep))  # type: ignore[arg-type]
    out_b = run_round(b, task, RoundInput(**base, peers=[peer]))  # type: ignore[arg-type]
    assert len(kept) == 1
    assert isinstance(kept[0], spool.PagedParams)
    for k in out_a.params:
        assert torch.equal(out_a.params[k], out_b.params[k]), k
    assert list(tmp_path.iterdir()) == []
