"""The demo tasks build their model before reading their data (issue 14: `peerd run` reads it
after READY=1): the shapes they assume are the data's, a missing package is still found at
once, and the data is read once, on prepare() or the first data()."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from peerd.learn import data as data_module
from peerd.learn.data import DATASET_SHAPES, DataError, check_dataset, load_dataset
from peerd.learn.tasks import DatasetTask, Preparable, load_task


def test_the_model_needs_no_data_and_matches_the_data() -> None:
    task = load_task("digits", partition_spec="iid", node_count=2)
    assert isinstance(task, DatasetTask)
    assert isinstance(task, Preparable)
    assert task._data is None  # built, not read
    model = task.model()
    ds = load_dataset("digits")
    assert DATASET_SHAPES["digits"] == (ds.input_shape, ds.num_classes)
    out = model(task.data().X_train[:3])  # data() reads it now
    assert out.shape == (3, ds.num_classes)
    assert torch.isfinite(out).all()


def test_prepare_reads_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = data_module.load_dataset

    def counting(name: str, *, root: Path | None = None) -> data_module.Dataset:
        calls.append(name)
        return real(name, root=root)

    monkeypatch.setattr("peerd.learn.tasks.load_dataset", counting)
    task = DatasetTask("digits", "iid", 0, 1, 0)
    task.prepare()
    first = task.data()
    task.prepare()
    assert task.data() is first
    assert calls == ["digits"]


def test_data_of_another_shape_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(DATASET_SHAPES, "digits", ((8, 8), 10))
    task = DatasetTask("digits", "iid", 0, 1, 0)
    with pytest.raises(DataError, match=r"not the expected \(8, 8\) and 10"):
        task.prepare()


def test_missing_files_are_found_before_anything_is_read(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is missing: apt-get install dataset-fashion-mnist"):
        check_dataset("fashion-mnist", root=tmp_path)
    with pytest.raises(DataError, match="unknown dataset"):
        check_dataset("cifar-10")
    check_dataset("digits")  # bundled with scikit-learn: there
