"""`peerd sim`: simulated mobile agents running the Cached-DFL core on real data.

Thin: the options become a :class:`peerd.sim.runner.SimConfig`; the run and its output files
are :mod:`peerd.sim`'s, imported only when the command runs.

``peerd sim [OPTIONS]`` is the weight/knowledge simulator as it always was; it is a group so
that methods whose setting has nothing in common with a mobility grid (views of the same
sample: cordial learning, FedCVT) are subcommands with their own options,
``peerd sim cordial ...``, instead of flags that mean nothing to the grid run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, TypeVar

import typer

from peerd.cli import simcordial, simfedcvt

if TYPE_CHECKING:
    from peerd.sim.engine import Engine

Opt = typer.Option
T = TypeVar("T")

app = typer.Typer(
    help="Simulate N mobile agents on a Manhattan grid and compare aggregation algorithms "
         "(the options below); `peerd sim cordial` and `peerd sim fedcvt` simulate learning "
         "across views of the same samples.",
    # The grid run is the group's own callback: `peerd sim --agents 10` keeps working.
    invoke_without_command=True,
    add_completion=False,
)


def _targets(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        typer.echo(f"error: --targets must be a comma list of fractions, got {text!r}", err=True)
        raise typer.Exit(2) from None


@app.callback(invoke_without_command=True)
def sim(
    ctx: typer.Context,
    dataset: Annotated[str, Opt(help="digits, mnist, fashion-mnist or breast_cancer (the "
                                     "daemon's \\[task] name).")] = "digits",
    partition: Annotated[str, Opt(help="iid, shards or dirichlet:PI (the daemon's \\[task] "
                                       "partition).")] = "shards",
    agents: Annotated[int, Opt(help="N \\[agents] (the daemon's \\[task] node_count).")] = 100,
    rounds: Annotated[int, Opt(help="Length of the run \\[rounds].")] = 100,
    capacity: Annotated[str, Opt(help="C \\[peer models per agent], or 'unlimited' (C = N: "
                                      "every peer fits) (the daemon's \\[learning] "
                                      "capacity).")] = "10",
    tau_max: Annotated[float, Opt(help="Staleness cutoff τ_max \\[rounds]: an entry is kept "
                                       "while t − τ ≤ τ_max (the lecture's rule; the paper "
                                       "drops it at t − τ ≥ τ_max, so its τ_max is this + 1). "
                                       "The daemon's \\[learning] tau_max is in seconds: this "
                                       "× --round-interval-s.")] = 5.0,
    local_steps: Annotated[int, Opt(help="K [SGD steps per round] (the daemon's \\[learning] "
                                         "local_steps).")] = 10,
    batch_size: Annotated[int, Opt(help="Mini-batch size \\[samples] (the daemon's \\[learning] "
                                        "batch_size).")] = 64,
    lr: Annotated[float, Opt(help="SGD learning rate \\[per step, unitless] (the daemon's "
                                  "\\[learning] lr).")] = 0.1,
    rho: Annotated[float, Opt(help="Proximal strength ρ \\[unitless] (the daemon's \\[learning] "
                                   "rho).")] = 0.0,
    alpha: Annotated[
        str,
        Opt(
            help="α policy: uniform, examples, examples-capped:CAP \\[samples], "
            "staleness:poly:A, staleness:hinge:A:B \\[rounds] (the daemon's \\[learning] alpha)."
        ),
    ] = "uniform",
    blend: Annotated[str, Opt(help="Blend rule (the daemon's \\[learning] blend): weighted, "
                                   "median, trimmed[:β=0.1] \\[fraction], clipped[:τ=1.0] "
                                   "[L2 norm], krum[:f=1] \\[models].")] = (
        "weighted"
    ),
    local_policy: Annotated[str, Opt(help="Local policy (the daemon's \\[learning] local_policy): "
                                          "plain or fedbss.")] = "plain",
    fedbss_warmup_rounds: Annotated[int, Opt(help="fedbss: plain rounds first \\[rounds] (the "
                                                  "daemon's \\[learning.fedbss] "
                                                  "warmup_rounds).")] = 20,
    fedbss_epochs: Annotated[int, Opt(help="fedbss: E \\[local epochs per round] (the daemon's "
                                           "\\[learning.fedbss] epochs).")] = 10,
    fedbss_steps: Annotated[int, Opt(help="fedbss: SGD steps per curriculum round, spread "
                                          "over the E epochs \\[steps] (0 = full epochs; "
                                          "--local-steps matches plain) (the daemon's "
                                          "\\[learning.fedbss] steps).")] = 0,
    attack: Annotated[str, Opt(help="Poisoning by the attackers: none, sign-flip[:s=4], "
                                    "gaussian[:k=1], label-flip, alie[:z], ipm[:ε=0.1] "
                                    "\\[scale factors, unitless].")] = (
        "none"
    ),
    attackers: Annotated[float, Opt(help="Fraction of agents that attack, in [0, 1) "
                                         "\\[fraction of N] (a seeded subset).")] = 0.0,
    algorithms: Annotated[str, Opt(help="Comma list of cached-dfl, dfl, fedavg, isolated; "
                                        "or fedcache[,fedcache-mobility,isolated,cached-dfl] "
                                        "(knowledge runs: "
                                        "the daemon's \\[learning] mode = \"knowledge\").")] = (
        "cached-dfl,dfl,fedavg"
    ),
    beta: Annotated[float, Opt(help="fedcache: distillation weight β \\[unitless] (the daemon's "
                                    "\\[learning.knowledge] beta).")] = 1.5,
    temperature: Annotated[float | None, Opt(help="fedcache: distillation temperature T "
                                                  "\\[unitless] (the daemon's "
                                                  "\\[learning.knowledge] temperature; unset: "
                                                  "the loss form's, 1 for eq18, 3 for code).",
                                             show_default=False)] = None,
    neighbours: Annotated[int, Opt(help="fedcache: R \\[neighbour samples averaged per sample] "
                                        "(the daemon's \\[learning.knowledge] neighbours).")] = 16,
    key_dim: Annotated[int, Opt(help="fedcache: sample key width \\[dimensions] (the daemon's "
                                     "\\[learning.knowledge] key_dim).")] = 64,
    distill_form: Annotated[str, Opt(help="fedcache: loss form \\[choice]: eq18 (the notes' "
                                          "eq. 18: CE on softmax(f/T) + β·KL(τ(f) ‖ τ(z̄)), T = 1 "
                                          "by default; to convergence level with code on "
                                          "FashionMNIST, lower on MNIST: docs/reproduction.md) "
                                          "or code (CE + β·T²·KL(τ(z̄) ‖ τ(f)), the paper's code, "
                                          "T = 3 by default).")] = "eq18",
    local_epoch: Annotated[str, Opt(help="fedcache: local epoch rule \\[choice]: client "
                                         "(ceil(n_k / batch) steps, each client its own) or "
                                         "mean (ceil(mean n / batch) for all, the docs' older "
                                         "runs).")] = "client",
    round1_knowledge: Annotated[str, Opt(help="fedcache: round-1 knowledge \\[choice]: zero "
                                              "(eq. 9: round 1 distils towards zero logits) "
                                              "or none (round 1 is CE only, the docs' older "
                                              "runs).")] = "zero",
    index_bytes: Annotated[int, Opt(help="fedcache: bytes of the sample index counted with "
                                         "each uploaded row \\[bytes] (4: int32; 0: the docs' "
                                         "older count).")] = 4,
    targets: Annotated[str, Opt(help="fedcache: comma list of mean-accuracy targets for acc@ "
                                     "\\[fraction].")] = "0.6,0.7",
    seed: Annotated[int, Opt(help="Seed for data split, init, mobility and batches (the "
                                  "daemon's \\[task] seed).")] = 0,
    out: Annotated[Path, Opt(help="Output folder for metrics and plots.")] = Path("sim-out"),
    model: Annotated[str, Opt(help="The model (the daemon's \\[task] model): weight runs cnn, "
                                   "mlp or linear (default: by dataset); fedcache runs small, "
                                   "medium, large (default) or mixed (by client index "
                                   "mod 3).")] = "",
    round_interval_s: Annotated[int, Opt(help="Time between rounds \\[seconds], which the "
                                              "agents move through in 1 s ticks (the "
                                              "daemon's \\[learning] round_interval_s).")] = 120,
    speed: Annotated[float, Opt(help="Agent speed \\[m/s].")] = 13.89,
    comm_range: Annotated[float, Opt(help="Communication range \\[m].")] = 100.0,
    blocks: Annotated[int, Opt(help="Grid size \\[blocks per side].")] = 10,
    block_length: Annotated[float, Opt(help="Block side length \\[m].")] = 300.0,
    eval_every: Annotated[int, Opt(help="Evaluate every this many rounds (and the last) "
                                        "\\[rounds].")] = 1,
    stats_from: Annotated[int, Opt(help="Average the cache statistics from this round on "
                                        "(skip the fill-up rounds) \\[round number].")] = 1,
    eval_samples: Annotated[int, Opt(help="Test samples used (0 = the full test set) "
                                          "\\[samples].")] = 0,
    mixed_schema: Annotated[bool, Opt(help="Each agent sees one feature group (tabular).")] = (
        False
    ),
    per_agent_loop: Annotated[bool, Opt(help="Train agents one by one (reference; slow).")] = (
        False
    ),
    engine: Annotated[str, Opt(help="Where training runs: local (this process) or ray "
                                    "(shards over Ray actors; pip install 'peerd\\[ray]'). "
                                    "Same seed, same summary.json on either.")] = "local",
    address: Annotated[str, Opt(help="ray: the cluster's address (`ray start --head` prints "
                                     "it); empty: a local Ray.")] = "",
    workers: Annotated[int, Opt(help="ray: actors training shards (0 = one per cluster "
                                     "CPU) \\[actors].")] = 0,
    shard_agents: Annotated[int, Opt(help="Agents per training shard, the unit of work on "
                                          "every engine (the numbers depend on it, not on the "
                                          "engine) \\[agents].")] = 100,
    entry_encoding: Annotated[str, Opt(help="How cached-dfl's entries cross the links: "
                                            "float32, float16, bfloat16, int8 (a scale per "
                                            "tensor) or int8:B (a scale per B values) (the "
                                            "daemon's \\[fleet] entry_encoding).")] = "float32",
    # Renamed to the config's names (issue 25): read for one release, with a notice.
    round_seconds: Annotated[int | None, Opt("--round-seconds", hidden=True)] = None,
    fedcache_models: Annotated[str | None, Opt("--fedcache-models", hidden=True)] = None,
    no_plots: Annotated[bool, Opt("--no-plots", help="Skip the PNG plots.")] = False,
    json_output: Annotated[bool, Opt("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Simulate N mobile agents on a Manhattan grid and compare aggregation algorithms."""
    if ctx.invoked_subcommand is not None:
        return  # `peerd sim <method> ...`: the subcommand runs, not the grid
    # Heavy imports here so that `peerd --help` stays instant.
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from peerd.learn.data import DataError
    from peerd.sim.output import summary_json, write_outputs
    from peerd.sim.rayengine import RayEngine
    from peerd.sim.runner import SimConfig, run

    round_interval_s = _renamed(ctx, "--round-seconds", round_seconds, round_interval_s)
    fedcache_model = _renamed(ctx, "--fedcache-models", fedcache_models, model) or "large"
    from peerd.cli.provenance import started

    names = tuple(a.strip() for a in algorithms.split(",") if a.strip())
    knowledge = any(n.startswith("fedcache") for n in names)  # fedcache, fedcache-mobility
    # Recorded as resolved: the new spellings, and a knowledge run's model by its name.
    if knowledge and temperature is None:  # the form's T, recorded as the value in force
        from peerd.core.distill import temperature_in_force

        temperature = temperature_in_force(None, distill_form)  # a bad form: validate says so
    run_started = started(ctx, round_interval_s=round_interval_s, temperature=temperature,
                          model=fedcache_model if knowledge else model)
    _check_engine(engine, address, workers, knowledge=knowledge)
    cap = _capacity(capacity, agents)
    if knowledge:
        from peerd.sim.knowledge import knowledge_cli

        if blend.strip() != "weighted":
            Console(stderr=True).print("[red]error:[/red] --blend applies to weight runs; "
                                       "fedcache averages no models")
            raise typer.Exit(2)
        if local_policy != "plain":
            Console(stderr=True).print("[red]error:[/red] --local-policy applies to weight "
                                       "runs; fedcache trains by distillation")
            raise typer.Exit(2)
        if entry_encoding != "float32":
            Console(stderr=True).print("[red]error:[/red] --entry-encoding applies to weight "
                                       "runs; fedcache's knowledge entries are float16")
            raise typer.Exit(2)
        if attack.strip() != "none" or attackers != 0:
            Console(stderr=True).print("[red]error:[/red] --attack applies to weight runs; "
                                       "fedcache publishes no models")
            raise typer.Exit(2)

        knowledge_cli(dataset=dataset, partition=partition, agents=agents, rounds=rounds,
                      algorithms=names, models=fedcache_model, lr=lr, batch_size=batch_size,
                      beta=beta, temperature=temperature, r=neighbours, key_dim=key_dim,
                      seed=seed, eval_every=eval_every, capacity=cap, tau_max=tau_max,
                      round_seconds=round_interval_s, out=out, json_output=json_output,
                      distill_form=distill_form, local_epoch=local_epoch,
                      round1_knowledge=round1_knowledge, index_bytes=index_bytes,
                      targets=_targets(targets), provenance=run_started)
        return
    config = SimConfig(
        dataset=dataset,
        partition=partition,
        agents=agents,
        rounds=rounds,
        capacity=cap,
        tau_max=tau_max,
        local_steps=local_steps,
        batch_size=batch_size,
        lr=lr,
        rho=rho,
        alpha=alpha,
        blend=blend,
        local_policy=local_policy,
        fedbss_warmup_rounds=fedbss_warmup_rounds,
        fedbss_epochs=fedbss_epochs,
        fedbss_steps=fedbss_steps,
        attack=attack,
        attackers=attackers,
        algorithms=tuple(a.strip() for a in algorithms.split(",") if a.strip()),
        seed=seed,
        model=model,
        round_seconds=round_interval_s,
        speed=speed,
        comm_range=comm_range,
        blocks=blocks,
        block_length=block_length,
        eval_every=eval_every,
        stats_from=stats_from,
        eval_samples=eval_samples,
        mixed_schema=mixed_schema,
        batched=not per_agent_loop,
        shard_agents=shard_agents,
        entry_encoding=entry_encoding,
    )
    err = Console(stderr=True)
    try:
        config.validate()
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    trainer = _engine(engine, address, workers)  # joining Ray fails here, before the bar
    total = config.rounds * len(config.algorithms)
    # The bar goes to stderr so that `--json` output on stdout stays machine-readable.
    with Progress(
        TextColumn("[bold]peerd sim[/bold] {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=err,
        transient=json_output,
    ) as bar:
        task = bar.add_task("loading", total=total)

        def progress(round_index: int, algorithm: str) -> None:
            bar.update(task, advance=1, description=f"round {round_index} {algorithm}")

        try:
            result = run(config, progress, trainer)
        except (DataError, ValueError) as exc:
            err.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
        finally:
            if isinstance(trainer, RayEngine):
                trainer.close()  # its actors, and the Ray it started
    write_outputs(result, out, plots=not no_plots, provenance=run_started.record())
    summary = summary_json(result)
    if json_output:
        typer.echo(json.dumps(summary))
        return
    console = Console()
    # soft_wrap: a long --out path stays one line (a terminal's width must not split it)
    console.print(f"wrote metrics{'' if no_plots else ' and plots'} to {out}", soft_wrap=True)
    for alg, res in summary["results"].items():
        line = f"{alg:>11}: final accuracy {res['final_accuracy_mean']:.4f} ± "
        line += f"{res['final_accuracy_std']:.4f}"
        if res["cache_avg_models"] is not None:
            age = res["cache_avg_age"]
            line += f"  (cache: {res['cache_avg_models']:.2f} models"
            line += f", age {age:.2f})" if age is not None else ")"
        if res["bytes_per_round"] is not None:
            line += f"  {res['bytes_per_round'] / 1e6:.2f} MB of entries per round"
        console.print(line)


#: Flags renamed to the daemon config's names (issue 25), each read for one release: the old
#: spelling -> its new one, the parameter behind it.
RENAMED: dict[str, tuple[str, str]] = {
    "--round-seconds": ("--round-interval-s", "round_interval_s"),
    "--fedcache-models": ("--model", "model"),
}


def _renamed(ctx: typer.Context, old: str, old_value: T | None, value: T) -> T:
    """The value of a renamed option: the old spelling's, with a one-line notice naming the
    new one, if it was given; both spellings at once are an error naming both (as the
    config's flat keys are)."""
    if old_value is None:
        return value
    new, param = RENAMED[old]
    # By name: typer's context is its own copy of click's, with its own enum.
    source = ctx.get_parameter_source(param)
    if source is not None and source.name == "COMMANDLINE":
        _fail(f"{old} and {new} are one option: keep {new} only")
    typer.echo(f"warning: {old} is deprecated: use {new}", err=True)
    return old_value


def _check_engine(engine: str, address: str, workers: int, *, knowledge: bool) -> None:
    """``--engine``/``--address``/``--workers``: one line on stderr and exit 2 if unusable."""
    from peerd.sim.rayengine import INSTALL_HINT, ray_available

    problem = ""
    if engine not in ("local", "ray"):
        problem = f"--engine must be local or ray, got {engine!r}"
    elif engine == "local" and (address or workers):
        problem = "--address and --workers apply to --engine ray"
    elif engine == "ray" and knowledge:
        problem = "--engine ray applies to weight runs (fedcache trains in this process)"
    elif workers < 0:
        problem = "--workers must be >= 0"
    elif engine == "ray" and not ray_available():
        problem = INSTALL_HINT
    if problem:
        _fail(problem)


def _fail(problem: str) -> NoReturn:
    from rich.console import Console
    from rich.markup import escape

    # escape: the install hint's 'peerd[ray]' is not a style.
    Console(stderr=True).print(f"[red]error:[/red] {escape(problem)}", soft_wrap=True)
    raise typer.Exit(2)


def _engine(engine: str, address: str, workers: int) -> Engine:
    """The engine ``--engine`` names: a started (or joined) Ray, or this process."""
    from peerd.sim.engine import LocalEngine
    from peerd.sim.rayengine import RayEngine

    if engine == "local":
        return LocalEngine()
    try:
        return RayEngine(address, workers)
    except RuntimeError as exc:  # no Ray, or none to join at --address
        _fail(str(exc))


def _capacity(value: str, agents: int) -> int:
    """``--capacity``: a number, or ``unlimited`` (C = N: no agent ever has more peers)."""
    if value.strip().lower() == "unlimited":
        return max(agents, 0)
    try:
        return int(value)
    except ValueError:
        from rich.console import Console

        Console(stderr=True).print(f"[red]error:[/red] --capacity must be a number or "
                                   f"'unlimited', got {value!r}")
        raise typer.Exit(2) from None


# The view methods: subcommands with their own options (their heavy imports are inside them).
app.command("cordial")(simcordial.cordial)
app.command("fedcvt")(simfedcvt.fedcvt)
