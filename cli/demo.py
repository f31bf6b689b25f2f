"""`peerd demo`: watch a live local mesh of real daemons learn.

As root the daemons run in network namespaces on a private bridge and find each other by
mDNS; otherwise on loopback with static peers (see :mod:`peerd.mesh.localmesh`). ``--in-process``
runs the same algorithm without processes or sockets, with an isolated baseline beside it.
Thin: the meshes are :mod:`peerd.mesh`'s and each daemon's status arrives typed
(:class:`peerd.control.status.Status`); this module only drives and renders them.

Exit status: 0 the target was reached (or Ctrl-C); 2 a daemon died or the mesh stalled:
every failed daemon is reported on stderr (its node, exit status and last log lines; one
JSON object with ``--json``). The live table fits 80 columns.
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

from peerd.core.modes import ModeName

if TYPE_CHECKING:
    from peerd.control.status import Status
    from peerd.mesh.inproc import RoundReport
    from peerd.mesh.localmesh import MeshNode
    from peerd.sim.provenance import Started

#: Daemons import torch, scikit-learn and libp2p before their first round: allow for it.
STARTUP_TIMEOUT_S = 180.0
#: Give up when no node finished a round for this long (a broken install, not a slow one).
STALL_TIMEOUT_S = 120.0
#: The mesh failed: a daemon died or no round finished in time (the report is on stderr).
EXIT_FAILED = 2
#: The narrowest terminal the live table is laid out for.
TABLE_WIDTH = 80
#: The most daemons: 32 with a small model fit a 2-core, 24 GB machine (docs/benchmarks.md,
#: "Fleet"); each is a Python process of ~300 MB that imports torch.
MAX_NODES = 32
#: With ``--round-interval``, τ_max is this many rounds (at least the default 60 s).
TAU_ROUNDS = 6


def _short(node_id: str) -> str:
    # As `peerd status` and the daemon's log lines show a node id: "…" and its last 6.
    return "…" + node_id[-6:]


class MeshFailedError(Exception):
    """The mesh cannot reach its target; the message says why (failures listed apart)."""


def _mesh_table(nodes: list[MeshNode], statuses: list[Status | None], rounds: int,
                elapsed: float) -> Table:
    # One line per node at 80 columns: the cache as a count and its oldest entry's age
    # (`peerd status` on a node lists the entries themselves).
    # Converged: a node's cache holds min(C, N − 1) entries younger than τ_max (the title
    # says it for a mesh taller than the terminal, whose last rows are cut).
    full = sum(1 for s in statuses if s is not None and sum(
        c.age_s < s.config.tau_max for c in s.cache) >= min(s.config.capacity, len(nodes) - 1))
    table = Table(title=f"peerd demo: {len(nodes)} daemons, target {rounds} rounds "
                        f"({elapsed:.0f} s), {full}/{len(nodes)} caches full")
    # "cache": how many entries, the oldest one's age; "acc": validation accuracy.
    for col in ("node", "address", "round", "ver", "cache", "peers", "acc"):
        table.add_column(col, justify="left" if col in ("node", "address", "cache")
                         else "right", no_wrap=True, overflow="ellipsis")
    for node, s in zip(nodes, statuses, strict=True):
        name = f"{node.index} {_short(node.id)}"
        address = node.address if node.host else f"{node.address}:{node.port}"
        if s is None:
            state = "exited" if not node.alive() else "starting…"
            table.add_row(name, address, "-", "-", state, "-", "-")
            continue
        oldest = max((c.age_s for c in s.cache), default=None)
        cache = "-" if oldest is None else f"{len(s.cache)}, {oldest:.0f} s"
        peers = sum(1 for p in s.peers if p.connected)
        acc = s.node.val_accuracy
        table.add_row(name, address, str(s.node.round), str(s.node.version), cache,
                      str(peers), "-" if acc is None else f"{acc:.3f}")
    return table


def failures(nodes: list[MeshNode]) -> list[dict[str, Any]]:
    """Every daemon that has exited: which node, its exit status, its last log lines."""
    return [{"node": node.index, "id": node.id, "exit_code": node.exit_code(),
             "log": str(node.log), "last_log_lines": node.tail()}
            for node in nodes if node.proc is not None and not node.alive()]


def report_failure(why: str, nodes: list[MeshNode], as_json: bool) -> None:
    """The failure on stderr: every dead daemon (or, if none died, every daemon's log tail)."""
    dead = failures(nodes)
    shown = dead or [{"node": n.index, "id": n.id, "exit_code": None, "log": str(n.log),
                      "last_log_lines": n.tail()} for n in nodes]
    if as_json:
        typer.echo(json.dumps({"error": why, "failures": shown}), err=True)
        return
    typer.echo(f"peerd demo: {why}", err=True)
    for f in shown:
        code = f["exit_code"]
        state = "still running" if code is None else f"exited with status {code}"
        typer.echo(f"node{f['node']} {_short(f['id'])} {state}; last lines of {f['log']}:",
                   err=True)
        for line in f["last_log_lines"] or ["(empty)"]:
            typer.echo(f"  {line}", err=True)


def _summary(nodes: list[MeshNode], statuses: list[Status | None]) -> dict[str, Any]:
    out = []
    for node, s in zip(nodes, statuses, strict=True):
        out.append({"id": node.id, "address": node.address,
                    "round": s.node.round if s else None,
                    "version": s.node.version if s else None,
                    "cache": [c.origin for c in s.cache] if s else [],
                    "val_accuracy": s.node.val_accuracy if s else None,
                    "test_accuracy": s.views.test_accuracy if s and s.views else None})
    return {"mode": "namespaces" if nodes and nodes[0].host else "loopback", "nodes": out}


#: The modes ``--mode`` runs (sensors: the integration tests' mesh, docs/tasks.md).
DEMO_MODES = (ModeName.WEIGHTS, ModeName.KNOWLEDGE, ModeName.CORDIAL)
#: ``--mode knowledge``: the nodes run FedCache's three model sizes, in turn.
KNOWLEDGE_MODELS = ("small", "medium", "large")


def _print_json(summary: dict[str, Any], run_started: Started | None) -> None:
    """The ``--json`` summary, with the run's provenance (issue 28: a summary quoted in the
    docs names its commit and full command) when the command line gave one."""
    if run_started is not None:
        summary = {**summary, "provenance": run_started.record()}
    print(json.dumps(summary))


def _run_mesh(nodes: int, rounds: int, task: str, as_json: bool, console: Console,
              mode: ModeName = ModeName.WEIGHTS, model: str | None = None,
              round_interval: float | None = None, isolated: bool = False,
              run_started: Started | None = None) -> None:
    from peerd.mesh import cordial, netns
    from peerd.mesh.localmesh import local_mesh

    why = netns.unavailable()
    console.print(f"starting {nodes} daemons " + (
        "in network namespaces (mDNS on a private bridge)" if why is None else
        f"on loopback with static peers ({why}; mDNS stays off outside namespaces)"))
    with tempfile.TemporaryDirectory(prefix="peerd-demo-") as tmp:
        knowledge = mode is ModeName.KNOWLEDGE
        learning: dict[str, object] = {"mode": mode.value} if knowledge else {}
        if mode is ModeName.CORDIAL:  # Pairwise-10: one digit per daemon, views between them
            learning = cordial.cordial_learning(nodes, isolated=isolated)
        if round_interval is not None:
            # Entries must outlive a few rounds and a fleet-wide spread, or caches never fill.
            learning |= {"round_interval_s": round_interval,
                         "tau_max": max(60.0, TAU_ROUNDS * round_interval)}
        models = KNOWLEDGE_MODELS if knowledge else None if model is None else (model,)
        with local_mesh(Path(tmp), nodes, task=task, learning=learning or None,
                        models=models) as mesh:
            statuses: list[Status | None] = [None] * nodes
            try:
                statuses = _watch(mesh, rounds, console, as_json)
            except KeyboardInterrupt:
                console.print("[yellow]interrupted: stopping the mesh[/yellow]")
            except MeshFailedError as exc:
                # Reported before the mesh stops: the temporary logs go with it.
                report_failure(str(exc), mesh, as_json)
                raise typer.Exit(code=EXIT_FAILED) from None
        summary = _summary(mesh, statuses)
        cordial_acc = cordial.mean_test_accuracy(statuses)
    if as_json:
        _print_json(summary, run_started)
        return
    accs = [n["val_accuracy"] for n in summary["nodes"] if n["val_accuracy"] is not None]
    if not console.is_terminal:
        console.line()  # rich ends its last live frame without a newline when not on a terminal
    if accs:
        console.print(f"stopped all daemons. mean validation accuracy "
                      f"[bold]{statistics.fmean(accs):.3f}[/bold] over {len(accs)} nodes")
    if cordial_acc is not None:
        console.print(f"mean test accuracy [bold]{cordial_acc:.3f}[/bold] "
                      f"({'isolated' if isolated else 'cordial, with views'})")


def _watch(mesh: list[MeshNode], rounds: int, console: Console,
           as_json: bool) -> list[Status | None]:
    """Poll and show the mesh until every node did ``rounds`` rounds; the last statuses.
    MeshFailedError when a daemon dies or no round finishes in time."""
    start = last_progress = time.monotonic()
    best = 0
    with Live(console=console, refresh_per_second=4, transient=as_json) as live:
        while True:
            statuses = [n.poll() for n in mesh]
            now = time.monotonic()
            live.update(Group(_mesh_table(mesh, statuses, rounds, now - start),
                              Text("Ctrl-C stops the mesh", style="dim")))
            done = [s.node.round for s in statuses if s]
            if done and sum(done) > best:
                best, last_progress = sum(done), now
            if len(done) == len(mesh) and min(done) >= rounds:
                return statuses
            if failures(mesh):
                _let_the_others_die(mesh)
                raise MeshFailedError(f"{len(failures(mesh))} of {len(mesh)} daemons exited")
            limit = STARTUP_TIMEOUT_S if best == 0 else STALL_TIMEOUT_S
            if now - last_progress > limit:
                raise MeshFailedError(f"no round finished for {limit:.0f} s")
            time.sleep(1.0)


#: After the first daemon exits, how long the others get to exit too before the report.
DEATH_GRACE_S = 2.0


def _let_the_others_die(mesh: list[MeshNode]) -> None:
    """Daemons failing of one cause (a broken install, a port range in use) exit moments
    apart: waiting a little for the rest, while any is still alive, lets the report name
    every one of them rather than the fastest, and so show that the cause is shared."""
    deadline = time.monotonic() + DEATH_GRACE_S
    while time.monotonic() < deadline and any(n.alive() for n in mesh):
        time.sleep(0.1)


def _run_inprocess(nodes: int, rounds: int, as_json: bool, console: Console,
                   run_started: Started | None = None) -> None:
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
        _print_json({"mode": "in-process", "nodes": [
            {"id": n.id, "round": n.round, "version": n.version,
             "cache": [o for o, _, _ in n.cache], "val_accuracy": n.val_accuracy}
            for n in last.nodes], "isolated_mean_val_accuracy": alone}, run_started)
        return
    console.print(f"mean accuracy [bold]{mesh:.3f}[/bold] vs {alone:.3f} trained in isolation")


def demo(
    ctx: typer.Context,
    nodes: Annotated[int, typer.Option("--nodes", min=2, max=MAX_NODES,
                                       help="Daemons.")] = 4,
    rounds: Annotated[int, typer.Option("--rounds", min=1, max=10_000,
                                        help="Stop once every node did this many.")] = 20,
    task: Annotated[str | None, typer.Option(
        "--task", help="digits (the default) | mnist | fashion-mnist; --mode cordial: "
                       "digits or mnist, the images its composites are drawn from")] = None,
    in_process: Annotated[bool, typer.Option("--in-process",
                                             help="No processes or sockets; adds an isolated "
                                                  "baseline.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print only a JSON summary.")] = False,
    mode: Annotated[str, typer.Option("--mode", help="weights | knowledge (per-sample logits; "
                                      "the nodes run small, medium and large models in "
                                      "turn) | cordial (Pairwise-10 composites, one digit per "
                                      "node, views exchanged)")] = "weights",
    model: Annotated[str | None, typer.Option(
        "--model", help="Model of every node (the config's task model key): linear, mlp, "
                        "small, ... Default: the task's own (digits: an MLP of 4,810 "
                        "parameters)")] = None,
    round_interval: Annotated[float | None, typer.Option(
        "--round-interval", min=0.5, max=3600.0,
        help="Seconds per round (default 2; τ_max becomes 6 rounds, at least 60 s). "
             "Longer for many nodes: they share the CPU")] = None,
    isolated: Annotated[bool, typer.Option(
        "--isolated", help="--mode cordial: the same daemons, no peer's view used (the "
                           "baseline)")] = False,
) -> None:
    """Start a live local mesh of peerd daemons, show them learn, stop them cleanly.

    Each node trains on its own non-IID slice of the task's data, finds the others, swaps
    signed cache entries and blends. Ctrl-C stops everything and prints the summary.
    """
    if mode not in DEMO_MODES:
        raise typer.BadParameter(f"choose {', '.join(DEMO_MODES[:-1])} or {DEMO_MODES[-1]}",
                                 param_hint="--mode")
    chosen = ModeName(mode)
    from peerd.mesh import cordial

    if chosen is ModeName.CORDIAL and task not in (None, *cordial.TASKS):
        # Pairwise-10 is built from digit images: another task cannot be honoured silently.
        raise typer.BadParameter("--mode cordial runs Pairwise-10 composites of digits or "
                                 "mnist only", param_hint="--task")
    task = task or (cordial.TASK if chosen is ModeName.CORDIAL else "digits")
    if task not in ("digits", "mnist", "fashion-mnist"):
        raise typer.BadParameter("choose digits, mnist or fashion-mnist", param_hint="--task")
    if isolated and chosen is not ModeName.CORDIAL:
        raise typer.BadParameter("--isolated is for --mode cordial", param_hint="--isolated")
    if model is not None:
        from peerd.learn.models import MODELS

        if model not in MODELS and ":" not in model:
            raise typer.BadParameter(f"choose one of {', '.join(MODELS)} or package.module:attr",
                                     param_hint="--model")
        if chosen is not ModeName.WEIGHTS or in_process:
            raise typer.BadParameter("--model is for weight-mode daemons (knowledge mode runs "
                                     "its three sizes, cordial mode the paper's LeNet-5)",
                                     param_hint="--model")
    if round_interval is not None and in_process:
        raise typer.BadParameter("--in-process counts rounds, not seconds",
                                 param_hint="--round-interval")
    console = Console(stderr=as_json)
    if in_process and chosen is not ModeName.WEIGHTS:
        raise typer.BadParameter("--in-process runs weight mode only", param_hint="--mode")
    if in_process and task != "digits":
        raise typer.BadParameter("--in-process runs digits only", param_hint="--task")
    from peerd.cli.provenance import started

    # The task as resolved: the recorded command must not depend on the mode's default.
    run_started = started(ctx, task=task)
    if in_process:
        _run_inprocess(nodes, rounds, as_json, console, run_started)
    else:
        _run_mesh(nodes, rounds, task, as_json, console, chosen, model, round_interval,
                  isolated, run_started)
