"""benchmarks._provenance: the recorded command spells out every default, so running it again
gives the same arguments even after a default changes; and the record names commit, dirty state,
machine, date and wall time."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

import pytest

from benchmarks import _provenance as prov


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--rate", type=float, default=0.5)
    p.add_argument("--out", type=Path, default=Path("docs/x"))
    p.add_argument("--label", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-plots", dest="plots", action="store_false")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2])
    p.add_argument("target", nargs="?", default="all")
    return p


def test_every_default_is_spelled_out_and_reparses_to_the_same_arguments() -> None:
    p = _parser()
    args = p.parse_args(["--quick"])
    argv = prov.expanded_argv(p, args)
    assert argv == ["all", "--rounds", "20", "--rate", "0.5", "--out", "docs/x", "--quick",
                    "--sizes", "1", "2"]
    assert p.parse_args(argv) == args
    # A later default change does not change what the recorded command means.
    changed = _parser()
    changed.set_defaults(rounds=99, quick=True)
    assert changed.parse_args(argv).rounds == 20
    off = p.parse_args(["--no-plots", "--label", "x y"])
    assert p.parse_args(prov.expanded_argv(p, off)) == off


def test_a_comma_list_type_is_spelled_as_one_comma_list() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=lambda s: [int(x) for x in s.split(",")], default=[10, 100])
    assert prov.expanded_argv(p, p.parse_args([])) == ["--nodes", "10,100"]


def test_what_it_cannot_spell_is_refused_not_recorded_wrong() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tag", action="append", default=[])
    with pytest.raises(ValueError, match="_AppendAction"):
        prov.expanded_argv(p, p.parse_args(["--tag", "a"]))
    q = argparse.ArgumentParser()
    q.add_argument("--size", type=lambda s: int(s) * 2, default=3)  # str(6) parses to 12
    with pytest.raises(ValueError, match="same arguments"):
        prov.expanded_argv(q, q.parse_args([]))


def test_the_record_names_commit_dirty_command_machine_date_and_wall() -> None:
    p = _parser()
    started = prov.start(p, p.parse_args([]))
    record = json.loads(json.dumps(started.record()))
    head = subprocess.run(["git", "-C", str(prov.ROOT), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert record["commit"] == head
    assert isinstance(record["dirty"], bool)
    assert record["dirty"] == bool(record["dirty_paths"])
    expected = prov.expanded_argv(p, p.parse_args([]))
    assert record["command"][-len(expected):] == expected
    assert record["args"]["out"] == "docs/x"
    assert set(record["machine"]) >= {"cores", "cpu", "torch_threads"}
    assert record["machine"]["torch_threads"] >= 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["date"])
    assert record["wall_s"] >= 0
    assert head[:12] in prov.line(record)


@pytest.mark.parametrize(("dirty", "paths", "shown"), [
    (False, [], "(clean)"),
    (True, ["docs/reproduction/x/"], "(dirty only in `docs/reproduction/x/`)"),
    (True, ["docs/a.json", "peerd/sim/train.py"], "(dirty)"),  # code changed: just dirty
    (True, [f"docs/{i}.json" for i in range(4)], "(dirty)"),  # too many to name
])
def test_the_line_names_what_was_dirty_only_when_it_was_outputs(
        dirty: bool, paths: list[str], shown: str) -> None:
    record = {"commit": "0" * 40, "dirty": dirty, "dirty_paths": paths, "command_line": "x",
              "machine": {"cpu": "c", "cores": 2, "torch_threads": 1}, "date": "d",
              "wall_s": 1.0}
    assert f"`{'0' * 12}` {shown}," in prov.line(record)
