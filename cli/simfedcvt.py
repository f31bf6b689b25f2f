"""`peerd sim fedcvt`: FedCVT against vanilla vertical FL on aligned samples only.

Thin: the options become a :class:`peerd.sim.fedcvt.FedCVTConfig` and a grid of alignment
fractions × seeds; the run is :mod:`peerd.sim.fedcvt`'s, imported only when the command runs.
Progress lines go to stderr, the summary (``--json``) to stdout; a bad option is one line on
stderr and exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

Opt = typer.Option


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _floats(text: str, option: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise _fail(f"{option} takes comma-separated numbers, got {text!r}") from None
    if not values:
        raise _fail(f"{option} needs at least one value")
    return values


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise _fail(f"{option} takes comma-separated integers, got {text!r}") from None
    if not values:
        raise _fail(f"{option} needs at least one value")
    return values


def fedcvt(
    ctx: typer.Context,
    dataset: Annotated[str, Opt(help="breast_cancer or mnist (two-party vertical split).")] = (
        "breast_cancer"
    ),
    aligned: Annotated[str, Opt(help="Comma list of aligned fractions, each in (0, 1) "
                                     "\\[fraction of the samples].")] = (
        "0.1,0.3"
    ),
    seeds: Annotated[str, Opt(help="Comma list of seeds.")] = "0,1,2",
    steps: Annotated[int, Opt(help="Optimizer steps per run (both methods) \\[steps].")] = 300,
    batch_size: Annotated[int, Opt(help="Rows per batch (aligned, A-only, B-only each) "
                                         "\\[samples].")] = 64,
    lr: Annotated[float, Opt(help="Adam learning rate \\[per step, unitless].")] = 1e-3,
    hidden: Annotated[int, Opt(help="Encoder hidden width \\[units].")] = 64,
    dim: Annotated[int, Opt(help="Representation size per party d_k \\[dimensions].")] = 16,
    threshold: Annotated[float, Opt(help="Pseudo-label confidence gate (each > this) "
                                           "\\[probability].")] = 0.5,
    sharpen: Annotated[float, Opt(help="Attention sharpening temperature (0: off, the "
                                         "seed's softmax(QKᵀ/√d_k); the paper's code: 0.1) "
                                         "\\[unitless].")] = 0.0,
    warmup_steps: Annotated[int, Opt(help="Steps before pseudo labels are used \\[steps].")] = 50,
    train_samples: Annotated[int, Opt(help="Training samples used (0: all) \\[samples].")] = 0,
    no_pseudo_labels: Annotated[bool, Opt("--no-pseudo-labels",
                                          help="Ablation: no gate, B-only rows unused.")] = False,
    no_fill: Annotated[bool, Opt("--no-fill", help="Ablation: no attention fill (needs "
                                                   "--no-pseudo-labels).")] = False,
    out: Annotated[Path | None, Opt(help="Also write the summary JSON to this file.")] = None,
    json_output: Annotated[bool, Opt("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """FedCVT (attention fill, gated pseudo labels, cross-view training) vs aligned-only VFL."""
    from peerd.learn.data import DataError
    from peerd.sim.fedcvt import FedCVTConfig, run_grid

    fractions = _floats(aligned, "--aligned")
    seed_list = _ints(seeds, "--seeds")
    config = FedCVTConfig(dataset=dataset, aligned=fractions[0], seed=seed_list[0], steps=steps,
                          batch_size=batch_size, lr=lr, hidden=hidden, dim=dim,
                          threshold=threshold, sharpen=sharpen, warmup_steps=warmup_steps,
                          train_samples=train_samples, pseudo_labels=not no_pseudo_labels,
                          fill=not no_fill)

    def progress(line: str) -> None:
        typer.echo(f"peerd sim fedcvt: {line}", err=True)

    from peerd.cli.provenance import started

    run_started = started(ctx)
    try:
        summary = run_grid(config, fractions, seed_list, progress)
    except (DataError, ValueError) as exc:
        raise _fail(str(exc)) from None
    summary["provenance"] = run_started.record()
    text = json.dumps(summary)
    if out is not None:
        out.write_text(text + "\n")
    if json_output:
        typer.echo(text)
        return
    typer.echo(f"{'aligned':>8}  {'vanilla VFL':>16}  {'FedCVT':>16}  gain")
    for row in summary["table"]:  # type: ignore[attr-defined]
        typer.echo(f"{row['aligned']:>8}  {row['vanilla_mean']:.4f} ± {row['vanilla_std']:.4f}"
                   f"  {row['fedcvt_mean']:.4f} ± {row['fedcvt_std']:.4f}"
                   f"  {row['gain_mean']:+.4f}")
