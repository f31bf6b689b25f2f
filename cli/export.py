"""`peerd export`: the node's trained model (or a cached origin's) as a file to use.

The state directory is ``--state-dir`` (or ``$PEERD_STATE_DIR``), as for every command, else
``[node] state_dir`` of ``-c CONFIG``, else that of ``/etc/peerd/peerd.toml`` if it exists,
else ``/var/lib/peerd``. It is read offline and read-only, so a running daemon is not disturbed.
``--format onnx`` builds the task's model to trace it, so it needs the node's config.

Exit status: 0 written; 1 nothing to export or it cannot be written (the message says why).
Thin: reading, checking and writing are :mod:`peerd.learn.export`'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from peerd.daemon.config import STATE_DIR_ENV

if TYPE_CHECKING:
    from peerd.daemon.config import Config
    from peerd.learn.tasks import Task

EXIT_ERROR = 1


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_ERROR)


def _config(path: Path | None) -> Config | None:
    from peerd.daemon.config import DEFAULT_CONFIG_PATH, ConfigError, load_config

    if path is None and not DEFAULT_CONFIG_PATH.is_file():
        return None
    try:
        return load_config(path or DEFAULT_CONFIG_PATH)
    except ConfigError as exc:
        if path is None:
            return None  # the system config, unreadable to this user: not asked for
        raise _fail(str(exc)) from None


def _state_dir(option: Path | None, config: Config | None) -> Path:
    from peerd.daemon.config import DEFAULT_STATE_DIR

    if option is not None:  # --state-dir, or $PEERD_STATE_DIR through the option's envvar
        return option
    return config.node.state_dir if config is not None else DEFAULT_STATE_DIR


def export(
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", metavar="FILE",
        help="File to write (default: model-ORIGIN-vVERSION.safetensors or .onnx).")] = None,
    state_dir: Annotated[Path | None, typer.Option(
        "--state-dir", envvar=STATE_DIR_ENV, readable=False,
        help="The node's state directory.")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", readable=False, metavar="FILE",
        help="The node's config: its state directory and task.")] = None,
    origin: Annotated[str | None, typer.Option(
        "--origin", metavar="NODE_ID",
        help="A cached origin's model instead of the node's own (id or its last 6).")] = None,
    fmt: Annotated[str, typer.Option(
        "--format", metavar="[safetensors|onnx]", help="File format.")] = "safetensors",
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print what was written as JSON.")] = False,
) -> None:
    """Write the node's current model as safetensors (or ONNX), with its provenance.

    The tensors are exactly those the node signed; the metadata names the origin, version,
    created_at, schema and task. Load it with the safetensors library (docs/operations.md).
    """
    from peerd.learn import export as ex

    if fmt not in ex.FORMATS:
        raise _fail(f"--format must be one of {', '.join(ex.FORMATS)}, not {fmt!r}")
    cfg = _config(config)
    directory = _state_dir(state_dir, cfg)
    try:
        model = ex.read_model(directory, origin)
        target = out if out is not None else ex.default_out(model, fmt)
        task_name = cfg.task.name if cfg is not None else None
        if fmt == "onnx":
            if cfg is None:
                raise _fail("--format onnx builds the task's model: give the node's config "
                            "with -c FILE")
            ex.write_onnx(model, target, _task(cfg))
        else:
            ex.write_safetensors(model, target, task=task_name)
    except ex.ExportError as exc:
        raise _fail(str(exc)) from None
    summary = {"path": str(target), "format": fmt, **ex.metadata(model, task_name),
               "own": model.own, "tensors": len(model.params)}
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    whose = "the node's own model" if model.own else f"cached model of {model.origin}"
    typer.echo(f"wrote {target}: {whose}, version {model.version}, "
               f"{len(model.params)} tensors, task {summary['task']}")


def _task(cfg: Config) -> Task:
    from peerd.learn.data import DataError
    from peerd.learn.tasks import TaskError, load_task

    t = cfg.task
    try:
        return load_task(t.name, partition_spec=t.partition, node_index=t.node_index,
                         node_count=t.node_count, seed=t.seed, csv_glob=t.csv_glob,
                         csv_label=t.csv_label, csv_features=t.csv_features,
                         csv_kind=t.csv_kind)
    except (TaskError, DataError) as exc:
        raise _fail(f"cannot build the task to trace its model: {exc}") from None
