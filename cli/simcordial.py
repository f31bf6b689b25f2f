"""`peerd sim cordial`: the cordial-learning reproductions (linear model, Pairwise-10 MNIST).

Thin: the options become a :class:`peerd.sim.cordial.CordialConfig`; the runs and the files
are :mod:`peerd.sim.cordial`'s, imported only when the command runs. Progress goes to stderr
so that ``--json`` leaves stdout machine-readable; a bad option is one line and exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

Opt = typer.Option


def cordial(
    ctx: typer.Context,
    experiment: Annotated[str, Opt(help="linear (§6.1) or pairwise10 (§6.2.1).")] = "linear",
    agents: Annotated[str, Opt(help="Comma list of agent counts N \\[agents] (default: "
                                    "8,16,32 for linear, 2,4,6 for pairwise10).")] = "",
    distributions: Annotated[str, Opt(help="linear: comma list of gaussian, laplace.")] = (
        "gaussian,laplace"
    ),
    runs: Annotated[int, Opt(help="linear: independent runs per configuration \\[runs].")] = 100,
    iterations: Annotated[int, Opt(help="linear: iterations per run \\[SGD iterations].")] = 20_000,
    images_per_digit: Annotated[int, Opt(help="pairwise10: P \\[images per digit] (the "
                                              "daemon's \\[learning.cordial] "
                                              "images_per_digit).")] = 25,
    epochs: Annotated[int, Opt(help="pairwise10: training length \\[epochs].")] = 300,
    seeds: Annotated[int, Opt(help="pairwise10: random seeds per method and N \\[seeds].")] = 3,
    methods: Annotated[str, Opt(help="pairwise10: comma list of isolated, cordial.")] = (
        "isolated,cordial"
    ),
    seed: Annotated[int, Opt(help="Base seed (the daemon's \\[task] seed).")] = 0,
    threads: Annotated[int, Opt(help="torch CPU threads \\[threads].")] = 1,
    out: Annotated[Path, Opt(help="Output folder.")] = Path("sim-out/cordial"),
    no_plots: Annotated[bool, Opt("--no-plots", help="Skip the PNG plot.")] = False,
    json_output: Annotated[bool, Opt("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Cordial learning: agents exchange embedded outputs of the same sample ids."""
    from rich.console import Console

    from peerd.sim.cordial import CordialConfig, parse_int_list

    err = Console(stderr=True)
    try:
        if threads < 1:
            raise ValueError("--threads must be at least 1")
        config = CordialConfig(
            experiment=experiment,
            agents=parse_int_list(agents, "--agents"),
            distributions=tuple(d.strip() for d in distributions.split(",") if d.strip()),
            runs=runs, iterations=iterations, seed=seed,
            images_per_digit=images_per_digit, epochs=epochs, seeds=seeds,
            methods=tuple(m.strip() for m in methods.split(",") if m.strip()),
        )
        config.validate()
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(2) from None
    # Heavy imports only once the options are known to be good.
    import torch
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from peerd.cli.provenance import started
    from peerd.learn.data import DataError
    from peerd.sim.cordial import public, run_cordial, write_outputs

    torch.set_num_threads(threads)
    run_started = started(ctx)
    with Progress(TextColumn("[bold]peerd sim cordial[/bold] {task.description}"), BarColumn(),
                  TextColumn("{task.completed}"), TimeElapsedColumn(), console=err,
                  transient=json_output) as bar:
        task = bar.add_task(experiment, total=None)

        def progress(label: str, k: int) -> None:
            bar.update(task, advance=k, description=label)

        try:
            summary = run_cordial(config, progress)
        except (DataError, ValueError) as exc:
            err.print(f"[red]error:[/red] {exc}", soft_wrap=True)
            raise typer.Exit(2) from None
    summary["provenance"] = run_started.record()
    write_outputs(summary, out, plots=not no_plots)
    if json_output:
        typer.echo(json.dumps(public(summary)))
        return
    console = Console()
    console.print(f"wrote cordial-{experiment}.* to {out}")
    for row in summary["configs"]:
        console.print(json.dumps(row))
