"""`peerd demo`: watch a live local mesh of real daemons learn.

As root the daemons run in network namespaces on a private bridge and find each other by
mDNS; otherwise on loopback with static peers (see :mod:`peerd.mesh.localmesh`). ``--in-process``
runs the same algorithm without processes or sockets, with an isolated baseline beside it.
Thin: the meshes are :mod:`peerd.mesh`'s and each daemon's status arrives typed
(:class:`peerd.control.status.Status`); this module only drives and renders them.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from peerd.control.status import Status
    from peerd.mesh.inproc import RoundReport
    from peerd.mesh.localmesh import MeshNode

#: Daemons import torch, scikit-learn and libp2p before their first round: allow for it.
STARTUP_TIMEOUT_S = 180.0
#: Give up when no node finished a round for this long (a broken install, not a slow one).
STALL_TIMEOUT_S = 120.0


def _short(node_id: str) -> str:
    return "…" + node_id[-6:]


def _mesh_table(nodes: list[MeshNode], statuses: list[Status | None], rounds: int,
                elapsed: float) -> Table:
    table = Table(title=f"peerd demo: {len(nodes)} daemons, target {rounds} rounds "
                        f"({elapsed:.0f} s)")
    for col in ("node", "address", "round", "version", "cache (origin@version, age)",
                "peers", "val acc"):
        table.add_column(col, justify="right" if col in ("round", "version") else "left")
    for node, s in zip(nodes, statuses, strict=True):
        if s is None:
            state = "exited - see " + str(node.log) if not node.alive() else "starting…"
            table.add_row(f"node{node.index} {_short(node.id)}", node.address, "-", "-",
                          state, "-", "-")
            continue
        cache = ", ".join(f"{_short(c.origin)}@{c.version} ({c.age_s:.0f}s)"
                          for c in s.cache) or "-"
        peers = sum(1 for p in s.peers if p.connected)
        acc = s.node.val_accuracy
        table.add_row(f"node{node.index} {_short(node.id)}", node.address,
                      str(s.node.round), str(s.node.version), cache, str(peers),
                      "-" if acc is None else f"{acc:.3f}")
    return table


def _summary(nodes: list[MeshNode], statuses: list[Status | None]) -> dict[str, Any]:
    out = []
    for node, s in zip(nodes, statuses, strict=True):
        out.append({"id": node.id, "address": node.address,
                    "round": s.node.round if s else None,
                    "version": s.node.version if s else None,
                    "cache": [c.origin for c in s.cache] if s else [],
                    "val_accuracy": s.node.val_accuracy if s else None})
    return {"mode": "namespaces" if nodes and nodes[0].host else "loopback", "nodes": out}


def _run_mesh(nodes: int, rounds: int, task: str, as_json: bool, console: Console) -> None:
    from peerd.mesh import netns
    from peerd.mesh.localmesh import local_mesh

    why = netns.unavailable()
    console.print(f"starting {nodes} daemons " + (
        "in network namespaces (mDNS on a private bridge)" if why is None else
        f"on loopback with static peers ({why}; mDNS stays off outside namespaces)"))
    with tempfile.TemporaryDirectory(prefix="peerd-demo-") as tmp:
        with local_mesh(Path(tmp), nodes, task=task) as mesh:
            statuses: list[Status | None] = [None] * nodes
            start = last_progress = time.monotonic()
            best = 0
            try:
                with Live(console=console, refresh_per_second=4, transient=as_json) as live:
                    while True:
                        statuses = [n.poll() for n in mesh]
                        now = time.monotonic()
                        live.update(Group(_mesh_table(mesh, statuses, rounds, now - start),
                                          Text("Ctrl-C stops the mesh", style="dim")))
                        done = [s.node.round for s in statuses if s]
                        if done and sum(done) > best:
                            best, last_progress = sum(done), now
                        if len(done) == nodes and min(done) >= rounds:
                            break
                        if not any(n.alive() for n in mesh):
                            raise typer.Exit(code=1)
                        limit = STARTUP_TIMEOUT_S if best == 0 else STALL_TIMEOUT_S
                        if now - last_progress > limit:
                            console.print(f"[red]no progress for {limit:.0f} s; logs are in "
                                          f"{tmp}[/red]")
                            raise typer.Exit(code=1)
                        time.sleep(1.0)
            except KeyboardInterrupt:
                console.print("[yellow]interrupted: stopping the mesh[/yellow]")
        summary = _summary(mesh, statuses)
    if as_json:
        print(json.dumps(summary))
        return
    accs = [n["val_accuracy"] for n in summary["nodes"] if n["val_accuracy"] is not None]
    if accs:
        console.print(f"stopped all daemons. mean validation accuracy "
                      f"[bold]{statistics.fmean(accs):.3f}[/bold] over {len(accs)} nodes")


def _run_inprocess(nodes: int, rounds: int, as_json: bool, console: Console) -> None:
    from peerd.mesh.inproc import MeshConfig, run_mesh

    def table(report: RoundReport) -> Table:
        t = Table(title=f"peerd demo --in-process: round {report.round}/{rounds}")
        for col in ("node", "version", "cache (origin@version, age)", "accuracy", "isolated"):
            t.add_column(col)
        for node, iso in zip(report.nodes, report.isolated_accuracy, strict=True):
            cache = ", ".join(f"{o}@{v} ({a}r)" for o, v, a in node.cache) or "-"
            t.add_row(node.id, str(node.version), cache, f"{node.val_accuracy:.3f}",
                      f"{iso:.3f}")
        return t

    last: RoundReport | None = None
    try:
        with Live(console=console, refresh_per_second=8, transient=as_json) as live:
            for report in run_mesh(MeshConfig(nodes=nodes, rounds=rounds)):
                last = report
                live.update(table(report))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
    if last is None:
        raise typer.Exit(code=130)
    mesh = statistics.fmean(n.val_accuracy for n in last.nodes)
    alone = statistics.fmean(last.isolated_accuracy)
    if as_json:
        print(json.dumps({"mode": "in-process", "nodes": [
            {"id": n.id, "round": n.round, "version": n.version,
             "cache": [o for o, _, _ in n.cache], "val_accuracy": n.val_accuracy}
            for n in last.nodes], "isolated_mean_val_accuracy": alone}))
        return
    console.print(f"mean accuracy [bold]{mesh:.3f}[/bold] vs {alone:.3f} trained in isolation")


def demo(
    nodes: Annotated[int, typer.Option("--nodes", min=2, max=16, help="Daemons.")] = 4,
    rounds: Annotated[int, typer.Option("--rounds", min=1, max=10_000,
                                        help="Stop once every node did this many.")] = 20,
    task: Annotated[str, typer.Option("--task", help="digits | mnist | fashion-mnist")] = (
        "digits"),
    in_process: Annotated[bool, typer.Option("--in-process",
                                             help="No processes or sockets; adds an isolated "
                                                  "baseline.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print only a JSON summary.")] = False,
) -> None:
    """Start a live local mesh of peerd daemons, show them learn, stop them cleanly.

    Each node trains on its own non-IID slice of the task's data, finds the others, swaps
    signed cache entries and blends. Ctrl-C stops everything and prints the summary.
    """
    if task not in ("digits", "mnist", "fashion-mnist"):
        raise typer.BadParameter("choose digits, mnist or fashion-mnist", param_hint="--task")
    console = Console(stderr=as_json)
    if in_process:
        if task != "digits":
            raise typer.BadParameter("--in-process runs digits only", param_hint="--task")
        _run_inprocess(nodes, rounds, as_json, console)
    else:
        _run_mesh(nodes, rounds, task, as_json, console)
