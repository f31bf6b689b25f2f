"""peerd.learn.learner.worker: the user's learner in a process of its own. It trains; each way
it can fail (raise, hang, NaN, wrong shapes, a negative count, SIGKILL) fails that call with
its reason and the next call works again (after the backoff, for a crash).

One worker serves most of the tests (``tests.learn.learners:Scripted`` does what the fit's
``run_config["do"]`` says): a start costs a Python and a torch import.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from peerd.learn.learner.check import schema_of
from peerd.learn.learner.contract import (
    FitConfig,
    LearnerContext,
    LearnerError,
    LearnerKind,
    Refusal,
)
from peerd.learn.learner.worker import Backoff, WorkerLearner, WorkerSpec
from tests.learn import learners

TIMEOUT_S = 3.0
GRACE_S = 0.5


def x_bar() -> dict[str, torch.Tensor]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return {k: v.detach().clone() for k, v in learners.model().state_dict().items()}


def config(do: str = "train", round_: int = 1) -> FitConfig:
    return FitConfig(round=round_, rho=0.1, steps=5, seed=11, device="cpu", batch_size=16,
                     lr=0.05, run_config={"do": do})


def make_worker(tmp_path: Path, entry: str = "tests.learn.learners:Scripted", *,
                timeout_s: float = TIMEOUT_S, backoff_s: float = 0.5,
                node_config: dict[str, str | int] | None = None) -> WorkerLearner:
    spec = WorkerSpec(kind=LearnerKind.PYTHON, entry=entry,
                      context=LearnerContext(node_id="12D3KooWtest", device="cpu",
                                             node_config=node_config or {}),
                      schema=schema_of(x_bar()), buffer_dir=tmp_path / "buffers",
                      timeout_s=timeout_s)
    return WorkerLearner(spec, grace_s=GRACE_S, backoff=Backoff(base_s=backoff_s, cap_s=2.0))


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerLearner]:
    w = make_worker(tmp_path_factory.mktemp("worker"))
    yield w
    w.close()


def refusal(w: WorkerLearner, do: str) -> LearnerError:
    with pytest.raises(LearnerError) as err:
        w.fit(x_bar(), x_bar(), config(do))
    return err.value


def test_a_python_learner_trains_in_its_worker(worker: WorkerLearner) -> None:
    start = x_bar()
    out = worker.fit(start, start, config())
    assert worker.pid is not None
    assert out.num_examples == learners.ROWS
    assert set(out.params) == set(start)
    assert all(bool(torch.isfinite(t).all()) for t in out.params.values())
    moved = sum(float((out.params[k] - start[k]).abs().sum()) for k in start)
    assert moved > 0.0  # AdamW moved it
    assert all(torch.equal(start[k], x_bar()[k]) for k in start)  # x̄ itself untouched
    assert set(out.metrics) == {"train_loss", "lr"}
    ev = worker.evaluate(out.params, config())
    assert ev.num_examples == learners.ROWS
    assert 0.0 <= ev.metrics["accuracy"] <= 1.0


def test_an_exception_fails_the_call_and_the_worker_lives_on(worker: WorkerLearner) -> None:
    pid = worker.pid
    err = refusal(worker, "raise")
    assert err.reason is Refusal.RAISED
    assert err.detail == "ValueError: bad batch"  # the type and first line only
    assert worker.pid == pid
    assert worker.fit(x_bar(), x_bar(), config()).num_examples == learners.ROWS


@pytest.mark.parametrize(("do", "reason"), [("nan", Refusal.NON_FINITE),
                                            ("shape", Refusal.SCHEMA),
                                            ("examples", Refusal.EXAMPLES)])
def test_a_bad_result_is_refused_by_name(worker: WorkerLearner, do: str,
                                         reason: Refusal) -> None:
    assert refusal(worker, do).reason is reason
    assert worker.fit(x_bar(), x_bar(), config()).num_examples == learners.ROWS


def test_params_and_anchor_are_separate_copies_on_write(worker: WorkerLearner) -> None:
    start = x_bar()
    out = worker.fit(start, start, config("write"))
    assert all(bool((t == 123.0).all()) for t in out.params.values())
    # The learner wrote into params; anchor (x̄) and the daemon's tensors did not move.
    assert out.metrics["anchor_sum"] == pytest.approx(sum(float(v.sum()) for v in start.values()))
    assert all(torch.equal(start[k], x_bar()[k]) for k in start)


def test_writes_into_the_kept_mappings_never_reach_the_next_call(
        worker: WorkerLearner) -> None:
    """The buffers stay mapped across calls; what one call wrote into a private view is
    dropped before the next: the learner's writes into ``params`` (worker side) and the
    daemon's into a result (its side)."""
    start = x_bar()
    worker.fit(start, start, config("write"))  # the learner fills its params with 123
    out = worker.fit(start, start, config("identity"))
    assert all(torch.equal(out.params[k], start[k]) for k in start)
    for t in out.params.values():
        t.fill_(-5.0)  # into the daemon's view of the output buffer
    again = worker.fit(start, start, config("identity"))
    assert all(torch.equal(again.params[k], start[k]) for k in start)


def test_a_hang_is_cut_after_timeout_s_and_a_fresh_worker_follows(
        worker: WorkerLearner) -> None:
    pid = worker.pid
    began = time.monotonic()
    err = refusal(worker, "hang")
    took = time.monotonic() - began
    assert err.reason is Refusal.TIMEOUT
    assert TIMEOUT_S <= took < TIMEOUT_S + 2 * GRACE_S + 2.0
    assert worker.pid is None  # stopped
    assert worker.fit(x_bar(), x_bar(), config()).num_examples == learners.ROWS
    assert worker.pid not in (None, pid)


def test_a_worker_killed_mid_fit_is_crashed_then_restarts_after_the_backoff(
        worker: WorkerLearner) -> None:
    starts = worker.starts
    err = refusal(worker, "kill")
    assert err.reason is Refusal.CRASHED
    assert "SIGKILL" in err.detail
    # While backing off a call fails at once, saying when it retries.
    began = time.monotonic()
    again = refusal(worker, "train")
    assert again.reason is Refusal.CRASHED
    assert "restarting in" in again.detail
    assert time.monotonic() - began < 0.2
    assert worker.starts == starts
    time.sleep(0.6)
    assert worker.fit(x_bar(), x_bar(), config()).num_examples == learners.ROWS
    assert worker.starts == starts + 1
    assert worker.backoff.crashes == 0  # a good fit resets the count


def test_crashes_in_a_row_double_the_backoff_up_to_its_cap() -> None:
    now = [100.0]
    b = Backoff(base_s=1.0, cap_s=5.0)
    delays = [b.crashed(now[0]) for _ in range(5)]
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert b.not_before == 105.0
    b.reset()
    assert (b.crashes, b.not_before) == (0, 0.0)


def test_a_factory_is_built_with_the_node_context_and_a_bad_entry_cannot_start(
        tmp_path: Path) -> None:
    w = make_worker(tmp_path, "tests.learn.learners:scripted", node_config={"do": "raise"})
    with pytest.raises(LearnerError) as raised:
        # No "do" in run_config: the factory's default, from node_config.
        w.fit(x_bar(), x_bar(), FitConfig(round=1, rho=0.0, steps=1, seed=0, device="cpu",
                                          batch_size=4, lr=0.1))
    assert raised.value.reason is Refusal.RAISED  # node_config's "do" = "raise"
    w.close()
    assert not list((tmp_path / "buffers").iterdir())  # the buffers go with it
    bad = make_worker(tmp_path, "tests.learn.no_such_module:x")
    with pytest.raises(LearnerError) as err:
        bad.start()
    assert err.value.reason is Refusal.CRASHED
    assert bad.last_crash is not None
    assert "ModuleNotFoundError" in bad.last_crash
    bad.close()
