"""`peerd init --fleet DIR`: write a working, commented config for a member of that fleet.

Reads the fleet directory made by ``peerd fleet init`` (``fleet.json`` for the fleet id and
admin public key, ``manifest.peerd`` for the signed member list), verifies the manifest
against that admin key, and writes a config in which every other setting is shown with its
default, commented out. With ``--out FILE`` the manifest is copied next to the config and
referenced by a relative path (relative paths are resolved against the config's folder), so
the pair can be installed together, e.g. into ``/etc/peerd/``. The state directory and the
socket are written as absolute paths: a relative ``--state-dir`` means the folder the
operator named, from where the command ran, not one under the config's folder. Without
``--socket`` the socket line stays commented out and the daemon derives it from the state
directory (:func:`peerd.daemon.config.default_socket`).

Owns the commented config text (:func:`render_config`, also the source of
``systemd/peerd.toml.example``). Otherwise thin: the fleet directory is read (and the
manifest copied) by peerd.store.fleetdir, and the text is checked by peerd.daemon.config
before it is written.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Annotated

import typer

from peerd.daemon.config import (
    DEFAULT_LISTEN_PORT,
    DEFAULT_STATE_DIR,
    STATE_DIR_ENV,
    ConfigError,
    default_socket,
    loads_config,
)
from peerd.store import fleetdir
from peerd.store.fleetdir import FLEET_FILE, MANIFEST_FILE, Fleet, FleetDirError, ManifestError
from peerd.store.statefile import atomic_write_raw


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def render_config(*, admin_public_key: str, fleet_id: str, manifest: str | None,
                  state_dir: str = str(DEFAULT_STATE_DIR),
                  socket: str | None = None) -> str:
    """The commented config text (also the source of ``systemd/peerd.toml.example``).
    ``socket`` None: commented out, showing the one derived from ``state_dir``."""
    manifest_line = (f"manifest = {_toml_str(manifest)}" if manifest is not None else
                     '# manifest = "manifest.peerd"   # none: learn it from peers')
    socket_line = (f"socket = {_toml_str(socket)}" if socket is not None else
                   f"# socket = {_toml_str(str(default_socket(Path(state_dir))))}")
    return f"""\
# peerd configuration (TOML). Reference: docs/operations.md.
# Only [fleet] is required; every commented-out line shows the default (or, for a
# setting that is off or automatic by default, an example value).
# Relative paths are relative to this file's folder.

[fleet]
# The fleet admin's Ed25519 public key and the fleet id, both hex (from fleet.json).
admin_public_key = {_toml_str(admin_public_key)}
fleet_id = {_toml_str(fleet_id)}
# The signed member list; newer ones (higher seq) are pulled from peers and kept in state.
{manifest_line}
# entry_encoding = "float32"   # float16 | bfloat16 | int8 | int8:256: fewer bytes per entry

[node]
# Identity key, cache entries, counters, audit log. Created 0700.
state_dir = {_toml_str(state_dir)}
# Control socket for `peerd status`. Default: /run/peerd/peerd.sock for the state_dir
# /var/lib/peerd, else <state_dir>/peerd.sock, so daemons on one machine never share one.
{socket_line}
# socket_group = "peerd"       # socket 0660 to this group instead of 0600
# torch_threads = 1            # training threads: leave cores to the device's real work
# lean_memory = true           # big buffers back to the OS at once: less peak RAM, slower steps
# log_level = "info"           # debug | info | warning | error

[network]
# listen_host = "0.0.0.0"
# listen_port = {DEFAULT_LISTEN_PORT}           # 0 = any free port (announced over mDNS)
# mdns = true
# mdns_interfaces = []         # e.g. ["eth0"]; empty = all
# static_peers = []            # ["/ip4/10.0.0.2/tcp/{DEFAULT_LISTEN_PORT}/p2p/12D3KooW..."]
# bootstrap = []               # members to join through; IPs or /dns4/NAME/tcp/PORT/p2p/ID
# metrics_listen = "127.0.0.1:9464"   # Prometheus endpoint; off unless set
# peer_bytes_per_s = 5000000    # per peer and direction; unset = 2 × what an honest peer needs
# max_concurrent_receives = 1   # entries received at once (each spooled to a temp file)
# fanout = 3                   # sessions started per gossip sweep (~3 s), oldest-synced first
# max_inbound_sessions = 8     # sessions peers opened that run at once; more are refused
# max_connections = 16         # open connections to peers; least recently synced closed

[learning]
# tau_max = 600.0              # staleness cutoff, seconds: older entries are dropped
# staleness = "time"           # the only mode ("rounds": simulator only, no shared counter)
# capacity = 10                # C: peer entries kept in the cache
# rho = 0.01                   # proximal weight towards the blended model
# local_steps = 10             # K: SGD steps per round
# batch_size = 32
# lr = 0.05
# alpha = "uniform"            # uniform | examples | examples-capped:N | staleness:poly:A ...
# epsilon = 0.0                # publish only when the model moved more than this
# round_interval_s = 10.0
# max_silence_s = 300.0        # epsilon > 0: republish after this long silent; unset = tau_max/2
# mode = "weights"             # weights (models, one architecture) | knowledge (logits)
#                              # | cordial (Pairwise-10 views) | sensors (views on time buckets)
# sample_capacity = 100000     # knowledge, cordial, sensors: samples cached over all peers
# blend = "weighted"           # weighted | median | trimmed[:0.1] | clipped[:1.0] | krum[:1]
# local_policy = "plain"       # plain | fedbss (warm-up, then an easy-to-hard curriculum)
# group = "site-1"             # this node's cache group, signed into its entries (unset: none)
# capacity_per_group = 3       # most cache places one group may hold (unset: C freshest)

# [learning.knowledge]: knowledge mode's settings (FedCache).
[learning.knowledge]
# key_dim = 64                 # sample key width (fleet-wide)
# beta = 1.5                   # weight of the KL term towards the teachers
# temperature = 1.0            # softmax temperature T (unset: 1 for eq18, 3 for code)
# neighbours = 16              # neighbours' knowledge averaged per sample
# form = "eq18"                # the loss: eq18 (the notes' eq. 18) or code (the paper code's)

# [learning.cordial]: the cordial and sensors modes' settings.
[learning.cordial]
# images_per_digit = 25        # cordial: P; the shared index is 27·P ids, fleet-wide
# coordination = true          # false = isolated baseline (no view used)
# warmup_epochs = 50           # cordial: epochs before the coordination layers train
# bucket_s = 10.0              # sensors: seconds of a time bucket (fleet-wide)
# window = 64                  # sensors: last buckets kept and published (4-4096)

# [learning.fedbss]: the fedbss local policy's settings (see docs/operations.md).
[learning.fedbss]
# warmup_rounds = 20           # plain rounds before the curriculum
# epochs = 10                  # E: local epochs of one curriculum round
# regrow = 0.2                 # warm up again when local data grew by this fraction
# steps = 0                    # SGD steps of a curriculum round (0 = epochs full epochs)

[validation]
# max_norm = 1e4               # reject entries whose parameter L2 norm is larger
# max_examples = 10000000      # cap on an entry's claimed example count
# max_future_skew_s = 300.0    # tolerated clock skew for created_at in the future
# update_norm = "off"          # off | reject | clip: entries far from the own model
# update_norm_multiple = 4.0   # bound: this × the median update norm seen
# update_norm_window = 64      # update norms remembered for that median
# update_norm_min_history = 8  # no bound until this many were seen (cold start)

[task]
# name = "digits"              # digits | mnist | fashion-mnist | csv | package.module:attr
#                              # (mode = "sensors" implies "sensors")
# partition = "dirichlet:0.5"  # demo tasks: iid | shards | dirichlet:PI
# node_index = 0               # demo tasks: this node's slice ...
# node_count = 1               # ... of this many
# seed = 0
# csv_glob = "/srv/data/*.csv" # required for name = "csv"; re-read every round
# csv_label = "label"
# csv_features = []            # empty = every column but the label
# csv_kind = "classification"  # classification | regression
# model = "large"              # small | medium | large | cnn | mlp | linear | pkg.mod:attr
"""


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _open_fleet(directory: Path) -> Fleet:
    try:
        return fleetdir.open_fleet(directory)
    except ManifestError as exc:
        raise _fail(f"manifest {exc.path} does not verify against {FLEET_FILE} "
                    f"({exc.code}): {exc.detail}") from None
    except FleetDirError as exc:
        raise _fail(str(exc)) from None


def _absolute(path: Path) -> str:
    # Against the cwd, normalised ("./h1/../h1/state" -> "/…/h1/state"); symlinks kept.
    return os.path.abspath(path)


def init(
    fleet: Annotated[Path, typer.Option("--fleet", help="Fleet directory (`peerd fleet init`).")],
    state_dir: Annotated[Path, typer.Option(
        "--state-dir", envvar=STATE_DIR_ENV,
        help="Node state directory (written as an absolute path).")] = DEFAULT_STATE_DIR,
    socket: Annotated[Path | None, typer.Option(
        "--socket", help="Control socket path (default: derived from the state directory: "
        "<state_dir>/peerd.sock, or /run/peerd/peerd.sock for /var/lib/peerd).")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Write here (manifest copied alongside); default: print.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --out.")] = False,
) -> None:
    """Write a commented config for a node of FLEET (admin key and manifest filled in)."""
    opened = _open_fleet(fleet)
    manifest = str(opened.manifest_path.resolve()) if out is None else MANIFEST_FILE
    text = render_config(admin_public_key=opened.info.admin_public_key.hex(),
                         fleet_id=opened.info.fleet_id.hex(), manifest=manifest,
                         state_dir=_absolute(state_dir),
                         socket=None if socket is None else _absolute(socket))
    try:
        loads_config(tomllib.loads(text))  # never hand out a config the daemon would refuse
    except ConfigError as exc:
        raise _fail(f"the generated config is invalid: {exc}") from None
    if out is None:
        typer.echo(text, nl=False)
        return
    if out.exists() and not force:
        raise _fail(f"{out} exists; use --force to overwrite it")
    out.parent.mkdir(parents=True, exist_ok=True)
    target_manifest = out.parent / MANIFEST_FILE
    try:
        # The manifest as verified above, not the file again: what the config points at is
        # what was checked.
        fleetdir.install_manifest(opened, target_manifest)
        # The config holds no secret (public key, paths): world-readable like /etc files.
        atomic_write_raw(out, text.encode(), mode=0o644, overwrite=True)
    except FleetDirError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(f"cannot write {out}: {exc.strerror}") from None
    typer.echo(f"wrote {out} and {target_manifest} (manifest seq {opened.manifest.seq}); "
               f"start with: peerd run --config {out}")
