"""`peerd status`: what the running daemon is doing (a thin client of the control API).

The socket is ``--socket``; else, with ``--state-dir DIR`` (or ``$PEERD_STATE_DIR``), the
socket of the daemon holding that directory's lock (:mod:`peerd.store.lock`), and when none
holds it the node is shown offline from its persisted state: never another node's socket;
else the socket of ``--config`` (``[node] socket``, or derived from its ``state_dir``), else
that of ``/etc/peerd/peerd.toml`` if it exists, else ``/run/peerd/peerd.sock``.

Exit status: 0 the daemon answered; 3 the daemon is not running (with ``--state-dir DIR``
its persisted state is printed first, marked as such); 1 any other failure (access denied,
timeout, bad config, an answer that is not a status).

``--watch`` redraws the status in place every ``--interval`` seconds (rich's Live display)
until Ctrl-C; when stdout is not a terminal it prints one complete status per refresh
instead (``--json``: one JSON document per line), with no cursor movement in the output.

Thin: the status' shape is :mod:`peerd.control.status`'s (this module only renders it),
the socket is :mod:`peerd.control.server`'s, and the persisted state is read through
:mod:`peerd.store.statedir` and :mod:`peerd.store.keyfile`, never parsed here.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from peerd.control.server import DEFAULT_TIMEOUT_S, ControlError, decode_result, request
from peerd.control.status import (
    LearnerStatus,
    OfflineCacheRow,
    OfflineNode,
    OfflineStatus,
    ReachabilityStatus,
    Status,
    TrackingStatus,
    ViewsStatus,
    from_json,
    membership_advice,
    to_json,
)
from peerd.core.modes import ModeName
from peerd.daemon.config import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_SOCKET,
    STATE_DIR_ENV,
    ConfigError,
    default_socket,
    load_config,
)
from peerd.protocol.identity import node_id_of
from peerd.store import lock as state_lock
from peerd.store.keyfile import NODE_KEY_FILE, KeyFileError, read_private_key
from peerd.store.statedir import StateDir, StateError, persisted_cache

EXIT_ERROR = 1
#: Like `systemctl status` for an inactive unit: scripts can tell "down" from "broken".
EXIT_NOT_RUNNING = 3

T = TypeVar("T")

JsonOption = Annotated[bool, typer.Option("--json", help="Print the daemon's JSON as is.")]
# readable=False: click's own readability check would pre-empt ours with a usage error; an
# unreadable config or a socket we may not use gets the documented message and exit status.
# "\\[node]": rich would take a bare [node] in help text for markup and drop it.
ConfigOption = Annotated[Path | None, typer.Option(
    "--config", "-c", readable=False, metavar="FILE",
    help="Daemon config file (its \\[node] socket is used).")]
SocketOption = Annotated[Path | None, typer.Option(
    "--socket", readable=False, help="Control socket path.")]
TimeoutOption = Annotated[float, typer.Option(
    "--timeout", min=0.1, max=600.0, help="Seconds to wait for the daemon.")]


#: The state directory of the node to show (or "-": none given).
StateDirOption = Annotated[Path | None, typer.Option(
    "--state-dir", envvar=STATE_DIR_ENV, readable=False,
    help="The node whose state directory this is: its daemon's socket, else (daemon "
    "down) the state persisted here.")]


def resolve_socket(socket: Path | None, config: Path | None,
                   state_dir: Path | None = None) -> Path | None:
    """The control socket to ask (see the module docstring); None: ``state_dir`` is held by
    no daemon, so there is nothing to ask (show it offline)."""
    if socket is not None:
        return socket
    configured = None
    if config is not None:
        try:
            configured = load_config(config).node
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(EXIT_ERROR) from None
    elif DEFAULT_CONFIG_PATH.is_file():
        # Unreadable to this user or broken: the daemon's default still applies.
        with contextlib.suppress(ConfigError):
            configured = load_config(DEFAULT_CONFIG_PATH).node
    if state_dir is None:
        return configured.control_socket if configured is not None else DEFAULT_SOCKET
    state_dir = state_dir.absolute()
    if os.access(state_dir, os.R_OK | os.X_OK):
        holder = state_lock.holder(state_dir)
        if holder is None:
            return None  # no daemon holds it: never ask another node's socket
        if holder.socket is not None:
            return holder.socket
    # Not readable to this user (a 0700 directory of the peerd user): the socket its config
    # names if that config is this node's, else the one derived from the directory.
    if configured is not None and configured.state_dir.absolute() == state_dir:
        return configured.control_socket
    return default_socket(state_dir)


def ask(socket: Path, method: str, timeout: float) -> dict[str, Any] | ControlError:
    """The daemon's answer, or the ControlError (callers decide how to report it)."""
    try:
        return request(socket, method, timeout)
    except ControlError as exc:
        return exc


def fail(exc: ControlError, *, hint: str = "") -> typer.Exit:
    typer.echo(f"error: {exc.message}{hint}", err=True)
    return typer.Exit(EXIT_NOT_RUNNING if exc.code == "not_running" else EXIT_ERROR)


def decode(socket: Path, answer: dict[str, Any], how: Callable[[dict[str, Any]], T]) -> T:
    """The typed form of the daemon's answer; exits 1 (with the reason) on a wrong shape."""
    try:
        return decode_result(socket, how, answer)
    except ControlError as exc:
        raise fail(exc) from None


def _fmt(value: float | str | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _short(node_id: str | None) -> str:
    # Ed25519 peer ids share the "12D3KooW" prefix: the tail is what tells nodes apart
    # (the last 6 characters, as the daemon's log lines show them).
    text = str(node_id)
    return text if len(text) <= 16 else f"…{text[-6:]}"


def _ts(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(stamp))


def render_status(console: Console, status: Status) -> None:
    console.print(status_view(status))


def status_view(status: Status) -> Group:
    """The human view of a status, as one renderable (printed, or redrawn by --watch)."""
    node, cfg = status.node, status.config
    parts: list[RenderableType] = [
        f"[bold]node[/bold] {node.id}  fleet {node.fleet}",
        f"round {_fmt(node.round)}  version {_fmt(node.version)}  "
        f"examples {_fmt(node.examples)}  train loss {_fmt(node.train_loss)}  "
        f"val accuracy {_fmt(node.val_accuracy)}",
        f"mode {cfg.mode}  blend {cfg.blend}  local policy {cfg.local_policy}  "
        f"task {cfg.task}" + ("" if cfg.learner == "builtin" else f"  learner {cfg.learner}"),
        f"τ_max {_fmt(cfg.tau_max, 1)}  C {_fmt(cfg.capacity)}  ρ {_fmt(cfg.rho, 4)}  "
        # K = 0 is knowledge mode's "one local epoch" ([learning] local_steps), not no training.
        f"K {'1 epoch' if cfg.local_steps == 0 else _fmt(cfg.local_steps)}  α {_fmt(cfg.alpha)}"
        + ("" if cfg.encoding == "float32" else f"  entries {cfg.encoding}"),
    ]
    advice = membership_advice(node.fleet, node.id, node.membership)
    if advice is not None:
        parts.append(Text(f"{node.membership}: {advice}", style="bold red"))
    cache = status.cache
    table = Table(title=f"cache ({_entries(len(cache))})")
    # Every mode but weights caches typed entries (knowledge, views): a kind column, and
    # their size is in samples. The status says the mode; nothing here infers it.
    typed = cfg.mode != ModeName.WEIGHTS
    groups = any(e.group is not None for e in cache)  # a group column once one is named
    # The weight a robust rule actually gave (clipped, Krum), once it differs from α.
    weighted = any(e.weight is not None for e in cache)
    # An encoding column once an origin sends anything but float32 (each origin chooses).
    encoded = any(e.encoding not in (None, "float32") for e in cache)
    for col in (("kind",) if typed else ()) + (("group",) if groups else ()) + (
                "origin", "version", "age s", "staleness",
                "samples" if typed else "examples", "α", *(("weight",) if weighted else ()),
                "drift", *(("encoding",) if encoded else ()), "from", "received", "verified"):
        # fold, not "…": a cut-off id or number is worse than a wrapped one
        table.add_column(col, justify="left" if col in ("origin", "from") else "right",
                         overflow="fold")
    for e in cache:
        table.add_row(*((e.kind,) if typed else ()), *((e.group or "-",) if groups else ()),
                      _short(e.origin), _fmt(e.version),
                      _fmt(e.age_s, 1),
                      _fmt(e.staleness, 1), _fmt(e.examples), _fmt(e.alpha),
                      *((_fmt(e.weight),) if weighted else ()), _fmt(e.drift, 4),
                      *((e.encoding or "-",) if encoded else ()), _short(e.received_from),
                      _ts(e.received_at), _fmt(e.verified))
    parts.append(table)
    if status.views is not None:
        parts.append(views_table(status.views))
    if status.learner is not None:
        parts.extend(learner_lines(status.learner))
    if status.tracking is not None:
        parts.append(tracking_line(status.tracking))
    if status.reachability is not None:
        parts.append(reachability_line(status.reachability))
    peers = status.peers
    connected = sum(1 for p in peers if p.connected)
    # How the connected ones are reached, once known: "; lan 2, relayed 1".
    paths: dict[str, int] = {}
    for p in peers:
        if p.connected and p.path is not None:
            paths[p.path] = paths.get(p.path, 0) + 1
    how = "; " + ", ".join(f"{k} {n}" for k, n in sorted(paths.items())) if paths else ""
    parts.append(f"peers: {connected} connected, {len(peers)} known{how} "
                 "(`peerd peers` for details)")
    g = status.gossip
    if g.get("sweeps"):  # the fanout bound at work: what an operator sizing a fleet checks
        parts.append(f"gossip: {g['sweeps']} sweeps, {g.get('dials', 0)} sessions started "
                     f"(most in one sweep {g.get('most_dials_in_a_sweep', 0)}, most at once "
                     f"{g.get('most_outbound_at_once', 0)})")
    busy, avoided = (g.get(k, 0) for k in ("busy_refusals", "duplicates_avoided"))
    if busy or avoided:  # the other bounds: worth a line once they bite
        parts.append(f"gossip: {busy} inbound sessions refused busy (max_inbound_sessions), "
                     f"{avoided} duplicate downloads avoided")
    lib = status.libp2p
    if lib.get("handler_errors") or lib.get("evicted"):  # mend 15 at work: worth a line
        parts.append(f"libp2p: {lib.get('handler_errors', 0)} failures inside its own "
                     f"handlers fenced, {lib.get('evicted', 0)} peerstore entries evicted "
                     f"(holds {lib.get('peerstore', 0)} peers)")
    rejected = status.rejected
    if rejected:
        rt = Table(title="rejected entries")
        rt.add_column("reason")
        rt.add_column("count", justify="right")
        for reason, count in sorted(rejected.items()):
            rt.add_row(str(reason), str(count))
        parts.append(rt)
    else:
        parts.append("rejected entries: none")
    return Group(*parts)


def reachability_line(r: ReachabilityStatus) -> str:
    """The relay client's: whether this node is dialable from outside, so holds no
    reservation (public) or holds them (private, unknown); and how many relays were learned."""
    if not r.relays and r.servers == 0:
        return "reachability: not checked (no relay configured or learned yet)"
    use = "no relay reservation needed" if r.verdict == "public" else "relay reservations held"
    learned = sum(1 for x in r.relays if x.source == "learned")
    if learned:
        use += f", {learned} learned relay{'' if learned == 1 else 's'}"
    ago = "not checked yet" if r.checked_s_ago is None else f"checked {r.checked_s_ago:.0f} s ago"
    return (f"reachability: {r.verdict} ({use}; {r.reached} of {r.servers} relays dialled us "
            f"back, {r.not_reached} could not; {ago})")


def tracking_line(t: TrackingStatus) -> RenderableType:
    """``[tracking]``: the sinks, rounds written and, once any, what failed."""
    text = f"tracking: {', '.join(t.sinks)}: {t.written} rounds written"
    failed = {k: n for k, n in t.failed.items() if n}
    if not (failed or t.dropped_rounds):
        return text
    counts = ", ".join(f"{k} {n}" for k, n in sorted(failed.items()))
    return Text(f"{text}; failed rounds: {counts or 'none'}; {t.dropped_rounds} dropped; "
                f"last error: {t.last_error or '-'}", style="yellow")


def learner_lines(lr: LearnerStatus) -> list[RenderableType]:
    """A learner of the user's: where it runs, its last metrics, its failures."""
    ext = lr.external
    if ext is not None:
        last = ("no publish yet" if ext.last_publish is None else
                f"last publish at {_ts(ext.last_publish)}"
                + ("" if ext.last_version is None else f" (version {ext.last_version})"))
        attached = "no client attached" if ext.clients == 0 else (
            f"{ext.clients} client{'s' * (ext.clients > 1)} attached")
        head = (f"learner: external on {lr.device}, {attached} to {ext.socket}; {last}, "
                f"{ext.publishes} publishes, {ext.blends} blends")
    else:
        worker = (f"worker pid {lr.worker_pid}" if lr.worker_pid is not None
                  else "no worker running")
        head = (f"learner: {lr.kind} {lr.entry or '-'} on {lr.device}, {worker} "
                f"({lr.worker_restarts} restarts)")
    lines: list[RenderableType] = [head]
    if lr.metrics:
        lines.append("learner metrics: " + "  ".join(f"{k} {_fmt(v, 4)}"
                                                     for k, v in sorted(lr.metrics.items())))
    failed = {k: n for k, n in lr.failed.items() if n}
    if failed:
        counts = ", ".join(f"{k} {n}" for k, n in sorted(failed.items()))
        lines.append(Text(f"learner failed rounds: {counts}; last (round "
                          f"{_fmt(lr.last_failed_round)}): {lr.last_failure}: "
                          f"{lr.last_detail or ''}", style="yellow"))
    return lines


def views_table(v: ViewsStatus) -> Table:
    """Cordial mode: whose views are held and how many of the current ids each covers."""
    use = "coordination on" if v.coordination else "isolated: views not used"
    # A regression (the sensor task) has no accuracy: its held-out loss is shown instead.
    score = f"test accuracy {_fmt(v.test_accuracy)}" if v.test_accuracy is not None \
        or v.test_loss is None else f"test loss {_fmt(v.test_loss, 4)}"
    table = Table(title=f"views: agent {v.agent} of {v.agents}, {v.ids} ids, {use}, "
                        f"epoch {_fmt(v.epoch, 1)}, {score}")
    for col in ("agent", "origin", "version", "age s", "ids", "used"):
        table.add_column(col, justify="left" if col == "origin" else "right", overflow="fold")
    for r in v.peers:
        table.add_row(_fmt(r.agent), _short(r.origin), _fmt(r.version), _fmt(r.age_s, 1),
                      f"{r.ids}/{v.ids}", "yes" if r.used else "no")
    return table


def _entries(n: int) -> str:
    return f"{n} entry" if n == 1 else f"{n} entries"


def offline_status(state_dir: Path) -> OfflineStatus:
    """What the state directory says while the daemon is down (``"running": false``)."""
    if not state_dir.is_dir():
        raise StateError(2, f"no state directory at {state_dir}")
    try:
        node_id: str | None = node_id_of(read_private_key(state_dir / NODE_KEY_FILE))
    except KeyFileError:
        node_id = None
    # Read-only: a daemon may be running after all (e.g. on another socket); creating,
    # tightening, cleaning temporary files or quarantining here would pull files from under it.
    state = StateDir(state_dir, readonly=True)
    counters = state.load_counters()
    # The cache index is read (and its values typed) by peerd.store.statedir, which owns it.
    cache = [OfflineCacheRow(origin=e.origin, version=e.version,
                             received_from=e.received_from, received_at=e.received_at,
                             blob=e.blob, bytes=e.size)
             for e in persisted_cache(state)]
    return OfflineStatus(running=False, state_dir=str(state_dir),
                         node=OfflineNode(id=node_id, round=counters.round,
                                          version=counters.version,
                                          counters_lost=counters.lost),
                         cache=tuple(cache))


def _print_offline(console: Console, info: OfflineStatus, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(to_json(info), indent=2))
        return
    node = info.node
    console.print(f"[bold]peerd is not running[/bold]; persisted state in {info.state_dir}:")
    console.print(f"node {node.id or '- (no readable node.key)'}  round {node.round}  "
                  f"version {node.version}")
    if node.counters_lost:
        console.print("[red]the counter files were corrupt and have been quarantined[/red]")
    table = Table(title=f"persisted cache ({_entries(len(info.cache))}, not verified)")
    for col in ("origin", "version", "from", "received", "bytes"):
        table.add_column(col, justify="right" if col in ("version", "bytes") else "left",
                         overflow="fold")
    for c in info.cache:
        table.add_row(c.origin, _fmt(c.version), _short(c.received_from),
                      _ts(c.received_at), str(c.bytes))
    console.print(table)


#: Bounds of --interval: faster than 10 refreshes a second only loads the daemon.
MIN_WATCH_INTERVAL_S = 0.1
MAX_WATCH_INTERVAL_S = 3600.0


def not_running(socket: Path | None, state_dir: Path | None) -> ControlError:
    where = f"no daemon holds {state_dir}" if socket is None else f"nothing listens on {socket}"
    return ControlError("not_running", f"peerd is not running? {where}")


def status(
    as_json: JsonOption = False,
    config: ConfigOption = None,
    socket: SocketOption = None,
    state_dir: StateDirOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    watch: Annotated[bool, typer.Option(
        "--watch", "-w", help="Redraw every --interval seconds until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(
        "--interval", min=MIN_WATCH_INTERVAL_S, max=MAX_WATCH_INTERVAL_S,
        help="Seconds between two refreshes of --watch.")] = 2.0,
    count: Annotated[int | None, typer.Option(
        "--count", min=1, help="With --watch: stop after this many refreshes.")] = None,
) -> None:
    """Show the daemon's round, model quality, cache and rejected entries."""
    path = resolve_socket(socket, config, state_dir)
    if watch:
        _watch(path, timeout, state_dir, as_json, interval, count)
        return
    answer = ask(path, "status", timeout) if path is not None else not_running(path, state_dir)
    console = Console()
    if isinstance(answer, ControlError):
        if answer.code != "not_running" or state_dir is None:
            hint = ("; use --state-dir DIR to read its persisted state"
                    if answer.code == "not_running" else "")
            raise fail(answer, hint=hint)
        try:
            info = offline_status(state_dir)
        except (StateError, OSError) as exc:
            typer.echo(f"error: {answer.message}; and cannot read {state_dir}: {exc}", err=True)
            raise typer.Exit(EXIT_NOT_RUNNING) from None
        _print_offline(console, info, as_json)
        raise typer.Exit(EXIT_NOT_RUNNING)
    assert path is not None  # an answer came from it
    typed = decode(path, answer, from_json)  # also for --json: never print a non-status
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
    else:
        render_status(console, typed)


def _view(path: Path | None, timeout: float, state_dir: Path | None,
          as_json: bool) -> RenderableType | str:
    """One refresh of --watch: the status, or why there is none (the watch goes on: a
    restarting daemon comes back)."""
    if path is None:
        # The daemon may start meanwhile: look again which socket holds the directory.
        path = resolve_socket(None, None, state_dir)
    answer = ask(path, "status", timeout) if path is not None else not_running(path, state_dir)
    stamp = time.strftime("%H:%M:%S")
    if isinstance(answer, ControlError):
        return (json.dumps({"error": answer.code, "message": answer.message}) if as_json
                else Text(f"{stamp}  {answer.message}", style="red"))
    assert path is not None  # an answer came from it
    try:
        typed = decode_result(path, from_json, answer)
    except ControlError as exc:
        return (json.dumps({"error": exc.code, "message": exc.message}) if as_json
                else Text(f"{stamp}  {exc.message}", style="red"))
    if as_json:
        return json.dumps(answer)
    return Group(Text(f"{stamp}  every refresh of --watch; Ctrl-C to stop", style="dim"),
                 status_view(typed))


def _watch(path: Path | None, timeout: float, state_dir: Path | None, as_json: bool,
           interval: float, count: int | None) -> None:
    console = Console()
    refreshes = 0

    def more() -> bool:
        return count is None or refreshes < count

    with contextlib.suppress(KeyboardInterrupt):
        if console.is_terminal and not as_json:
            # Redrawn in place; what is left on screen at Ctrl-C is the last status.
            with Live(console=console, auto_refresh=False, transient=False) as live:
                while more():
                    live.update(_view(path, timeout, state_dir, as_json), refresh=True)
                    refreshes += 1
                    if more():
                        time.sleep(interval)
            return
        # Not a terminal (a pipe, a file, a journal): no cursor movement, one complete
        # status per refresh, so what is written reads (and parses) in order.
        while more():
            view = _view(path, timeout, state_dir, as_json)
            if isinstance(view, str):
                typer.echo(view)
            else:
                console.print(view)
                console.print()
            refreshes += 1
            if more():
                time.sleep(interval)
