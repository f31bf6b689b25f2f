"""`peerd demo`'s live table at 80 columns and its failure report (no daemons started)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from peerd.cli.demo import TABLE_WIDTH, _mesh_table, report_failure
from peerd.control.status import Status
from peerd.mesh.localmesh import MeshNode, daemon_argv
from peerd.mesh.netns import Host
from tests.daemon.helpers import sample_status

IDS = [f"12D3KooW{'x' * 38}{i:06d}" for i in range(8)]


def _nodes(tmp_path: Path, n: int) -> list[MeshNode]:
    return [MeshNode(i, tmp_path / f"node{i}", IDS[i], 4011 + i, None) for i in range(n)]


def test_the_live_table_is_one_line_per_node_at_80_columns(tmp_path: Path) -> None:
    nodes = _nodes(tmp_path, 8)
    # Full caches of long ids, big numbers: the widest rows the demo can show.
    base = sample_status()
    row = dataclasses.replace(base.cache[0], origin=IDS[1], age_s=86_399.0)
    status = dataclasses.replace(
        base, cache=(row,) * 15,
        node=dataclasses.replace(base.node, round=99_999, version=99_999, val_accuracy=1.0))
    statuses: list[Status | None] = [status] * 6 + [None, None]
    console = Console(width=TABLE_WIDTH, record=True, color_system=None)
    console.print(_mesh_table(nodes, statuses, 10_000, 12345.0))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= TABLE_WIDTH
    body = [line for line in lines if line.startswith("│")]
    assert len(body) == 8, "\n".join(lines)  # one line per node, none wrapped
    assert sum("…" in line for line in lines) == 8  # nothing cut off but the ids
    assert all("15, 86399 s" in line for line in body[:6])
    for node in nodes:  # ids shortened one way: "…" and the last 6 characters
        assert sum(f"{node.index} …{node.id[-6:]}" in line for line in lines) == 1


def test_a_32_node_mesh_fits_80_columns_and_its_title_counts_full_caches(
        tmp_path: Path) -> None:
    ids = [f"12D3KooW{'x' * 38}{i:06d}" for i in range(32)]
    nodes = [MeshNode(i, tmp_path / f"node{i}", ids[i], 4011, Host(f"h{i}", f"10.78.0.{i + 1}"))
             for i in range(32)]
    base = sample_status()
    full = dataclasses.replace(base, config=dataclasses.replace(base.config, capacity=31),
                               cache=(base.cache[0],) * 31)  # 31 entries of 12.5 s < τ_max
    stale_row = dataclasses.replace(base.cache[0], age_s=base.config.tau_max + 1)
    stale = dataclasses.replace(full, cache=(base.cache[0],) * 30 + (stale_row,))
    statuses: list[Status | None] = [*([full] * 30), stale, None]
    console = Console(width=TABLE_WIDTH, record=True, color_system=None)
    console.print(_mesh_table(nodes, statuses, 20, 95.0))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= TABLE_WIDTH
    assert len([line for line in lines if line.startswith("│")]) == 32
    assert any("32 daemons" in line and "30/32 caches full" in line for line in lines), lines
    assert sum("10.78.0.32 " in line for line in lines) == 1


def _died(node: MeshNode, code: int, lines: list[str]) -> None:
    node.dir.mkdir(parents=True)
    node.log.write_text("".join(f"{line}\n" for line in lines))
    node.proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    node.proc.wait()


def test_every_dead_daemon_is_reported_as_json_on_stderr(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = _nodes(tmp_path, 3)
    _died(nodes[0], 2, [f"line {i}" for i in range(40)])
    _died(nodes[2], 1, ["peerd: no identity key"])
    nodes[1].proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        report_failure("2 of 3 daemons exited", nodes, as_json=True)
    finally:
        nodes[1].proc.kill()
        nodes[1].proc.wait()
    out, err = capsys.readouterr()
    assert out == ""
    report = json.loads(err)
    assert report["error"] == "2 of 3 daemons exited"
    assert [(f["node"], f["exit_code"]) for f in report["failures"]] == [(0, 2), (2, 1)]
    assert report["failures"][0]["last_log_lines"] == [f"line {i}" for i in range(28, 40)]
    assert report["failures"][1]["last_log_lines"] == ["peerd: no identity key"]


def test_the_human_report_names_node_status_and_log(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = _nodes(tmp_path, 2)
    _died(nodes[1], 2, ["peerd: port 4012 is in use"])
    report_failure("1 of 2 daemons exited", nodes, as_json=False)
    err = capsys.readouterr().err
    assert f"node1 …{IDS[1][-6:]} exited with status 2; last lines of {nodes[1].log}:" in err
    assert "  peerd: port 4012 is in use" in err
    assert "node0" not in err  # alive nodes are not failures


def test_daemons_are_started_by_this_installation_not_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A `peerd` package in the working directory would shadow the install for `python -m`.
    shadow = tmp_path / "peerd"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    (shadow / "cli.py").write_text("raise SystemExit('shadowed')\n")
    monkeypatch.chdir(tmp_path)
    result = subprocess.run([*daemon_argv("--version")], capture_output=True, text=True,
                            check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("peerd ")


def test_demo_json_exits_2_naming_each_dead_daemon_and_its_log(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from peerd.cli.app import app
    from peerd.mesh import localmesh, netns

    # Daemons that die at start-up (as a shadowed or broken install would), on loopback.
    monkeypatch.setattr(netns, "unavailable", lambda: "not in this test")
    monkeypatch.setattr(localmesh, "daemon_argv", lambda *args: [
        sys.executable, "-c", "import sys; print('peerd: cannot start: no module'); sys.exit(2)"])
    result = CliRunner().invoke(app, ["demo", "--nodes", "2", "--rounds", "1", "--json"])
    assert result.exit_code == 2
    assert '"nodes"' not in result.stdout  # no summary of a mesh that never ran
    report = json.loads(result.stderr.strip().splitlines()[-1])
    assert report["error"] == "2 of 2 daemons exited"
    assert [(f["node"], f["exit_code"]) for f in report["failures"]] == [(0, 2), (1, 2)]
    for f in report["failures"]:
        assert f["last_log_lines"] == ["peerd: cannot start: no module"]
