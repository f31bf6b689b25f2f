"""`peerd sim` speaks the config's language (issue 25, item 4): a flag for a knob the daemon
config has is named like its key, the old spellings still run for one release with a
one-line notice naming the new flag, and ``--json``'s config block lists every option of the
run under its flag's name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from peerd.cli import sim as sim_cmd
from peerd.cli.app import app
from peerd.sim.knowledge import KnowledgeSimConfig, config_json

TINY = ["sim", "--agents", "3", "--rounds", "1", "--local-steps", "1", "--blocks", "2",
        "--eval-samples", "50", "--algorithms", "cached-dfl", "--no-plots", "--json"]
#: Options that say where a run goes or runs, not what it computes (the engine's output is
#: the same on either, so summary.json must not name it).
NOT_IN_CONFIG = {"out", "no_plots", "json_output", "engine", "address", "workers"}
#: FedCache's own options: a weight run has no use for them.
KNOWLEDGE_ONLY = {"beta", "temperature", "neighbours", "key_dim", "distill_form", "local_epoch",
                  "round1_knowledge", "index_bytes", "targets"}


def _options() -> dict[str, Any]:
    """The grid run's visible options, by parameter name."""
    command = typer.main.get_group(sim_cmd.app)
    return {p.name: p for p in command.params if p.name and not getattr(p, "hidden", False)}


def _run(args: list[str], tmp_path: Path) -> tuple[dict[str, Any], list[str]]:
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr.splitlines()


def test_the_json_config_lists_every_option_under_its_flags_name(tmp_path: Path) -> None:
    doc, err = _run(TINY, tmp_path)
    assert not [line for line in err if "deprecated" in line]
    listed = set(doc["config"])
    wanted = {"batched" if n == "per_agent_loop" else n
              for n in _options()} - NOT_IN_CONFIG - KNOWLEDGE_ONLY
    assert wanted <= listed, wanted - listed
    # ... and nothing under a name no flag has (attacker_count: what --attackers came to).
    assert listed - wanted == {"attacker_count"}
    assert doc["config"]["round_interval_s"] == 120
    assert json.loads((tmp_path / "summary.json").read_text())["config"] == doc["config"]


def test_the_knowledge_config_block_names_its_options_as_the_flags_do() -> None:
    block = config_json(KnowledgeSimConfig(r=4, models="mixed", dirichlet=0.5,
                                           round_seconds=30))
    assert set(block) <= set(_options())  # each key is a flag of the run
    assert (block["neighbours"], block["model"], block["partition"],
            block["round_interval_s"]) == (4, "mixed", "dirichlet:0.5", 30)
    assert {"beta", "temperature", "key_dim", "lr", "batch_size", "capacity", "tau_max",
            "seed", "agents", "rounds", "algorithms", "dataset", "eval_every"} <= set(block)


def test_an_old_flag_runs_the_same_run_with_one_notice(tmp_path: Path) -> None:
    new, new_err = _run([*TINY, "--round-interval-s", "20"], tmp_path / "new")
    old, old_err = _run([*TINY, "--round-seconds", "20"], tmp_path / "old")
    assert old == new
    assert new["config"]["round_interval_s"] == 20
    assert [line for line in old_err if "deprecated" in line] == [
        "warning: --round-seconds is deprecated: use --round-interval-s"]
    assert not [line for line in new_err if "deprecated" in line]


@pytest.mark.parametrize(("args", "model"), [
    (["--model", "small"], "small"),
    (["--fedcache-models", "small"], "small"),
    ([], "large"),  # fedcache's default, whatever a weight run's would be
])
def test_the_fedcache_model_is_model_and_fedcache_models_an_alias(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], model: str) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr("peerd.sim.knowledge.knowledge_cli", lambda **kw: seen.update(kw))
    result = CliRunner().invoke(app, ["sim", "--algorithms", "fedcache", "--partition",
                                      "dirichlet:1.0", *args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert seen["models"] == model
    notices = [line for line in result.stderr.splitlines() if "deprecated" in line]
    assert notices == (["warning: --fedcache-models is deprecated: use --model"]
                       if "--fedcache-models" in args else [])


@pytest.mark.parametrize(("old", "new", "value"), [
    ("--round-seconds", "--round-interval-s", "20"),
    ("--fedcache-models", "--model", "small"),
])
def test_both_spellings_at_once_are_one_line_and_exit_2(tmp_path: Path, old: str, new: str,
                                                        value: str) -> None:
    result = CliRunner().invoke(app, [*TINY, old, value, new, value, "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {old} and {new} are one option: keep {new} only"


def test_help_names_the_config_keys_and_units_and_hides_the_old_flags() -> None:
    result = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["sim", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for shown in ("[learning] local_steps", "[learning] round_interval_s",
                  "[learning.knowledge] neighbours", "[learning.fedbss] warmup_rounds",
                  "[task] model", "τ_max [rounds]", "Time between rounds [seconds]"):
        assert shown in text, shown
    for old in sim_cmd.RENAMED:
        assert old not in text
    # Every option that takes a value says what it is measured in, or that it has no unit.
    helps = {n: p.help or "" for n, p in _options().items() if not p.is_flag}
    plain = {"dataset", "partition", "local_policy", "algorithms", "out", "engine",
             "address", "model", "seed"}
    assert [n for n, h in helps.items() if n not in plain and "[" not in h] == []
