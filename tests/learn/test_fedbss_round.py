"""The daemon's round with ``[learning] local_policy = "fedbss"``: warm-up rounds are the plain
round bit for bit, then the curriculum; a CSV task whose data grows past ``fedbss_regrow``
warms up again; the config refuses FedBSS where it cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from peerd.core.alpha import AlphaPolicy
from peerd.core.fedbss import FedBSS, WarmupState
from peerd.core.staleness import Clock
from peerd.daemon.config import ConfigError, LearningConfig, load_config
from peerd.learn.localpolicy import LocalTraining
from peerd.learn.tasks import load_task
from peerd.learn.trainer import RoundInput, run_round
from tests.daemon.helpers import ADMIN_HEX, FLEET_HEX
from tests.learn.test_tasks import write_csv

FLEET = f'[fleet]\nadmin_public_key = "{ADMIN_HEX}"\nfleet_id = "{FLEET_HEX}"\n'


def _inp(local: LocalTraining | None, round_: int) -> RoundInput:
    return RoundInput(own_id="me", cache=(), peers=[], clock=Clock.time(100.0),
                      policy=AlphaPolicy.parse("uniform"), steps=3, batch_size=8, lr=0.1,
                      rho=0.0, seed=round_, local=local)


def _curriculum(local: LocalTraining) -> bool:
    return local.last_was_curriculum  # read through a call: mypy narrows attributes


def test_warmup_rounds_equal_plain_rounds_then_curriculum_and_rewarmup(tmp_path: Path) -> None:
    write_csv(tmp_path / "day1.csv", [(i % 7, i % 3, i % 2) for i in range(60)])
    task = load_task("csv", csv_glob=str(tmp_path / "*.csv"), csv_features=("a", "b"))
    fed, plain = task.model(), task.model()
    plain.load_state_dict(fed.state_dict())
    local = LocalTraining(FedBSS(warmup_rounds=2, epochs=3, regrow_fraction=0.5))
    for r in range(2):
        a = run_round(fed, task, _inp(local, r))
        b = run_round(plain, task, _inp(None, r))
        assert not _curriculum(local)
        assert a.train_loss == b.train_loss
        for k, v in fed.state_dict().items():
            assert torch.equal(v, plain.state_dict()[k])
    run_round(fed, task, _inp(local, 2))
    assert _curriculum(local)
    n = local.state.base_size
    # New rows arrive (the CSV task re-reads its files every round): past 1.5 × n the node
    # warms up again from the new size.
    write_csv(tmp_path / "day2.csv", [(i % 5, 1, i % 2) for i in range(60, 160)])
    run_round(fed, task, _inp(local, 3))
    assert not _curriculum(local)
    assert local.state == WarmupState(1, len(task.data().y_train))
    assert local.state.base_size > 1.5 * n


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "peerd.toml"
    path.write_text(FLEET + body)
    return path


def test_config_reads_the_local_policy(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path, '[learning]\nlocal_policy = "fedbss"\n'
                                        "[learning.fedbss]\nwarmup_rounds = 3\nepochs = 4\n"
                                        "regrow = 0.5\n"))
    local = LocalTraining.of(cfg.learning)
    assert local is not None
    assert local.policy == FedBSS(3, 4, 0.5)
    flat = load_config(_config(tmp_path, '[learning]\nlocal_policy = "fedbss"\n'
                                         "fedbss_warmup_rounds = 3\nfedbss_epochs = 4\n"
                                         "fedbss_regrow = 0.5\n"))  # deprecated, still read
    assert flat.learning == cfg.learning
    assert LocalTraining.of(LearningConfig()) is None  # plain: the round's default


@pytest.mark.parametrize(("body", "match"), [
    ('[learning]\nlocal_policy = "fedbss"\nmode = "knowledge"\n', "mode"),
    ('[learning]\nlocal_policy = "curriculum"\n', "local_policy"),
    ('[learning]\nlocal_policy = "fedbss"\nfedbss_epochs = 0\n', "fedbss_epochs"),
    ('[learning]\nlocal_policy = "fedbss"\n[learning.fedbss]\nepochs = 0\n',
     r"\[learning.fedbss\] epochs"),
    ('[learning]\nlocal_policy = "fedbss"\n[task]\nname = "csv"\ncsv_glob = "/x/*.csv"\n'
     'csv_kind = "regression"\n', "classification"),
])
def test_config_refuses_fedbss_where_it_cannot_run(tmp_path: Path, body: str,
                                                    match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(_config(tmp_path, body))
