"""`peerd demo`: watch a small mesh learn, live.

For now the mesh is in-process (:mod:`peerd.inproc`): real core code, simulated meetings, no
sockets. The networked demo (real daemons, mDNS in network namespaces) replaces it once the
daemon exists.
"""

from __future__ import annotations

import json
import statistics
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

if TYPE_CHECKING:
    from peerd.inproc import RoundReport



def _table(report: RoundReport, total: int) -> Table:
    table = Table(title=f"peerd demo (in-process mesh) - round {report.round}/{total}")
    table.add_column("node")
    table.add_column("version", justify="right")
    table.add_column("cache (origin@version, age)")
    table.add_column("train loss", justify="right")
    table.add_column("accuracy", justify="right")
    table.add_column("isolated", justify="right")
    for node, iso in zip(report.nodes, report.isolated_accuracy, strict=True):
        cache = ", ".join(f"{o}@{v} ({age}r)" for o, v, age in node.cache) or "-"
        table.add_row(node.id, str(node.version), cache, f"{node.train_loss:.3f}",
                      f"{node.val_accuracy:.3f}", f"{iso:.3f}")
    return table


def demo(
    nodes: int = typer.Option(4, "--nodes", min=2, max=16, help="Number of nodes in the mesh."),
    rounds: int = typer.Option(30, "--rounds", min=1, max=1000, help="Rounds to run."),
    task: str = typer.Option("digits", "--task", help="Task (only digits in the in-process demo)."),
    capacity: int = typer.Option(3, "--capacity", min=0, help="Cache capacity C (peer entries)."),
    tau_max: int = typer.Option(5, "--tau-max", min=0, help="Staleness cutoff in rounds."),
    seed: int = typer.Option(0, "--seed", help="Seed for data, init, batches and meetings."),
    as_json: bool = typer.Option(False, "--json", help="Print only the final summary as JSON."),
) -> None:
    """Run a live local mesh learning non-IID digits, then print a summary.

    Each node sees only 3 of the 10 digit classes. Nodes train, meet random peers, swap
    verified cache entries and blend; the 'isolated' column trains the same nodes alone.
    """
    from peerd.inproc import MeshConfig, run_mesh  # torch: imported only when needed

    if task != "digits":
        raise typer.BadParameter("the in-process demo supports digits only", param_hint="--task")
    cfg = MeshConfig(nodes=nodes, rounds=rounds, capacity=capacity, tau_max=tau_max, seed=seed)
    console = Console(stderr=as_json)
    last: RoundReport | None = None
    try:
        if as_json:
            for report in run_mesh(cfg):
                last = report
        else:
            with Live(console=console, refresh_per_second=8) as live:
                for last in run_mesh(cfg):
                    live.update(_table(last, rounds))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: summary of the last completed round[/yellow]")
    if last is None:
        raise typer.Exit(code=130)
    mesh_mean = statistics.fmean(n.val_accuracy for n in last.nodes)
    alone_mean = statistics.fmean(last.isolated_accuracy)
    if as_json:
        print(json.dumps({
            "mode": "in-process",
            "nodes": [
                {"id": n.id, "round": n.round, "version": n.version,
                 "cache": [o for o, _, _ in n.cache], "val_accuracy": n.val_accuracy}
                for n in last.nodes
            ],
            "mean_val_accuracy": mesh_mean,
            "isolated_mean_val_accuracy": alone_mean,
        }))
        return
    console.print(
        f"after {last.round} rounds: mesh mean accuracy [bold]{mesh_mean:.3f}[/bold] "
        f"vs isolated {alone_mean:.3f} (full digits test set, {len(last.nodes)} nodes)"
    )
