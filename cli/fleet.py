"""`peerd fleet init/admit/revoke/show`: the offline admin side of fleet membership.

A fleet directory holds ``admin.key`` (the admin's Ed25519 key, 0600; keep this directory
offline), ``fleet.json`` (fleet id and admin public key: what every node's config needs),
``manifest.peerd`` (the current signed manifest, to copy to one node; it then spreads) and
``admissions.json`` (when each member was admitted: the admin's own, unsigned record).

Every command names the directory with ``--fleet DIR`` (``init`` and ``show`` also take it
as their argument; ``show`` also takes a manifest file). ``admit`` and ``revoke`` are
idempotent: a request that changes nothing writes nothing and keeps the manifest's seq,
and each prints what changed.
Thin: parses options and prints; the directory is read and written by peerd.store.fleetdir.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import public_key_from_node_id
from peerd.protocol.limits import MAX_AGENT_INDEX, PUBLIC_KEY_LEN
from peerd.protocol.manifest import Manifest
from peerd.store import fleetdir
from peerd.store.fleetdir import (
    FLEET_FILE,
    MANIFEST_FILE,
    Admission,
    Change,
    FleetAdmin,
    FleetDirError,
    ManifestError,
)

app = typer.Typer(
    help="Fleet membership: an admin-signed manifest of who may publish entries.",
    no_args_is_help=True,
)

FleetDir = Annotated[Path, typer.Option(
    "--fleet", metavar="DIR", help="Fleet directory (from `fleet init`).")]
FleetDirOrArg = Annotated[Path | None, typer.Option(
    "--fleet", metavar="DIR", help="Fleet directory (or give it as the argument).")]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _tampered(exc: ManifestError) -> typer.Exit:
    return _fail(f"{exc}; it may have been tampered with")


def _read_manifest(path: Path, admin: bytes, fleet_id: bytes) -> Manifest:
    try:
        return fleetdir.read_manifest(path, admin, fleet_id)
    except ManifestError as exc:
        raise _tampered(exc) from None
    except FleetDirError as exc:
        raise _fail(str(exc)) from None


def _load_admin(directory: Path) -> FleetAdmin:
    try:
        return fleetdir.open_admin(directory)
    except ManifestError as exc:
        raise _tampered(exc) from None
    except FleetDirError as exc:
        raise _fail(str(exc)) from None


def _parse_expiry(text: str, now: float) -> float:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise _fail(f"--expires {text!r} is not an ISO 8601 date or datetime") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # a bare date means 00:00 UTC of that day
    stamp = when.timestamp()
    if stamp <= now:
        raise _fail(f"--expires {text} is in the past")
    return stamp


def _one_dir(option: Path | None, argument: Path | None, what: str) -> Path:
    if option is not None and argument is not None and option != argument:
        raise _fail(f"{what} given twice ({argument} and --fleet {option})")
    chosen = option if option is not None else argument
    if chosen is None:
        raise _fail(f"which fleet? give --fleet DIR ({what})")
    return chosen


@app.command("init")
def init(
    directory: Annotated[Path | None, typer.Argument(
        metavar="DIR", help="New fleet directory (same as --fleet DIR).")] = None,
    fleet_dir: FleetDirOrArg = None,
) -> None:
    """Create a fleet: admin key, fleet id and an empty manifest (seq 1)."""
    directory = _one_dir(fleet_dir, directory, "the new fleet directory")
    try:
        fleet = fleetdir.create(directory).fleet
    except FleetDirError as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"fleet id:         {fleet.info.fleet_id.hex()}")
    typer.echo(f"admin public key: {fleet.info.admin_public_key.hex()}")
    typer.echo(f"manifest:         {fleet.manifest_path} (seq {fleet.manifest.seq}, no members)")


@app.command("admit")
def admit(
    fleet: FleetDir,
    node_id: Annotated[str, typer.Argument(
        metavar="NODE_ID", help="Node id (12D3KooW...) from `peerd keygen`.")],
    expires: Annotated[
        str | None, typer.Option("--expires", metavar="DATE",
                                 help="Membership end, ISO 8601 (UTC if no zone).")
    ] = None,
    agent: Annotated[
        int | None, typer.Option(
            "--agent", metavar="N", min=0, max=MAX_AGENT_INDEX,
            help="Bind the node to cordial agent N (its [task] node_index): only its views "
                 "are used as agent N's. Kept when omitted on a renewal.")
    ] = None,
) -> None:
    """Admit a node, or change a member's expiry or agent; re-signs the manifest (seq + 1).

    Admitting a member again with the same expiry and agent changes nothing (the seq stays).
    In cordial mode a peer's views are used only if the manifest binds it to the agent
    they name, so admit every cordial node with --agent.
    """
    admin = _load_admin(fleet)
    try:
        public_key = public_key_from_node_id(node_id)
    except ProtocolError as exc:
        raise _fail(f"{node_id!r} is not a node id: {exc.message}") from None
    now = time.time()
    not_after = None if expires is None else _parse_expiry(expires, now)
    try:
        admin, change = admin.admit(public_key, not_after, now=now, agent=agent)
    except (ValueError, FleetDirError) as exc:
        raise _fail(str(exc)) from None
    _print_change(admin, change, not_after)
    bound = admin.fleet.manifest.agent_of(change.node_id)
    if change.changed and bound is not None:
        typer.echo(f"{change.node_id} speaks for cordial agent {bound}")


@app.command("revoke")
def revoke(
    fleet: FleetDir,
    node_id: Annotated[str, typer.Argument(
        metavar="NODE_ID", help="Node id to revoke (permanently).")],
) -> None:
    """Revoke a member for good; re-signs the manifest with seq + 1.

    Revoking an id that is already revoked, or was never a member, changes nothing.
    """
    admin = _load_admin(fleet)
    try:
        public_key_from_node_id(node_id)
        admin, change = admin.revoke(node_id, now=time.time())
    except ProtocolError as exc:
        raise _fail(f"{node_id!r} is not a node id: {exc.message}") from None
    except (ValueError, FleetDirError) as exc:
        raise _fail(str(exc)) from None
    _print_change(admin, change, None)


def _iso(stamp: float | None) -> str | None:
    if stamp is None:
        return None
    return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="seconds")


def _expiry(stamp: float | None) -> str:
    return _iso(stamp) or "never"


def _print_change(admin: FleetAdmin, change: Change, not_after: float | None) -> None:
    seq = admin.fleet.manifest.seq
    if not change.changed:
        typer.echo(f"{change.node_id}: {change.detail}; nothing changed (manifest seq {seq})")
        return
    if change.what == "renewed":
        typer.echo(f"renewed {change.node_id}: expires {_expiry(not_after)} "
                   f"(was {_expiry(change.previous_not_after)}) (manifest seq {seq})")
    elif change.what == "admitted":
        typer.echo(f"admitted {change.node_id}, expires {_expiry(not_after)} "
                   f"(manifest seq {seq})")
    else:
        typer.echo(f"{change.what} {change.node_id} (manifest seq {seq})")
    typer.echo(f"copy {admin.fleet.manifest_path} to one node of the fleet; it spreads from there")


def _show_target(path: Path | None, fleet_dir: Path | None) -> tuple[Path, Path | None]:
    """(manifest file, fleet directory whose admission record describes it, if any)."""
    if path is not None and path.is_dir():
        fleet_dir, path = _one_dir(fleet_dir, path, "the fleet directory"), None
    if path is None:
        if fleet_dir is None:
            raise _fail("which fleet? give --fleet DIR, or a manifest file")
        return fleet_dir / MANIFEST_FILE, fleet_dir
    if fleet_dir is not None:
        raise _fail("give either --fleet DIR or a manifest file, not both")
    # The admission record belongs to the fleet directory's own manifest, not to a copy
    # that may be older or newer than it.
    own = path.name == MANIFEST_FILE and fleetdir.has_info(path.parent)
    return path, path.parent if own else None


def _admissions(directory: Path | None) -> dict[str, Admission]:
    if directory is None:
        return {}
    try:
        return fleetdir.read_admissions(directory)
    except FleetDirError as exc:
        raise _fail(str(exc)) from None


@app.command("show")
def show(
    path: Annotated[Path | None, typer.Argument(
        metavar="PATH",
        help="Fleet directory, or a manifest file (e.g. a node's copy).")] = None,
    fleet_dir: FleetDirOrArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    admin_key: Annotated[
        str | None, typer.Option("--admin-key", metavar="HEX",
                                 help="Trusted admin public key (hex).")
    ] = None,
) -> None:
    """Verify a manifest and list its members, each with the time it was admitted.

    A tampered or foreign manifest exits non-zero. Admission times come from the fleet
    directory's own record (admissions.json): shown for its manifest, "unknown" where the
    record has none (the signed manifest carries no times).
    """
    file, directory = _show_target(path, fleet_dir)
    if admin_key is not None:
        try:
            trusted = bytes.fromhex(admin_key)
        except ValueError:
            raise _fail("--admin-key must be hex") from None
        if len(trusted) != PUBLIC_KEY_LEN:
            raise _fail(f"--admin-key must be {PUBLIC_KEY_LEN} bytes")
        trust_source = "--admin-key"
        fleet_id: bytes | None = None
    elif fleetdir.has_info(file.parent):
        try:
            info = fleetdir.read_info(file.parent)
        except FleetDirError as exc:
            raise _fail(str(exc)) from None
        fleet_id, trusted = info.fleet_id, info.admin_public_key
        trust_source = str(file.parent / FLEET_FILE)
    else:
        raise _fail(f"no {FLEET_FILE} next to {file}: pass --admin-key to say whom to trust")
    if fleet_id is None:
        # With only an admin key, take the fleet id from the envelope: the signature still
        # binds it (it is part of the signed input), so a forged one fails verification.
        try:
            fleet_id = fleetdir.read_manifest_envelope(file).fleet_id
        except FleetDirError as exc:
            raise _fail(str(exc)) from None
    manifest = _read_manifest(file, trusted, fleet_id)
    record = _admissions(directory)
    data: dict[str, Any] = {
        "fleet_id": manifest.fleet_id.hex(),
        "seq": manifest.seq,
        "admin_public_key": trusted.hex(),
        "verified_against": trust_source,
        "members": [
            {"node_id": m.node_id, "public_key": m.public_key.hex(),
             "not_after": _iso(m.not_after), "agent": m.agent,
             "admitted_at": _iso(record.get(m.node_id, Admission()).admitted_at),
             "admitted_seq": record.get(m.node_id, Admission()).admitted_seq}
            for m in manifest.members
        ],
        "revoked": sorted(manifest.revoked),
        "revoked_at": {r: _iso(record.get(r, Admission()).revoked_at)
                       for r in sorted(manifest.revoked)},
    }
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(
        f"fleet {data['fleet_id']}  seq {manifest.seq}  "
        f"(signature OK, admin key from {trust_source})"
    )
    typer.echo(f"members ({len(manifest.members)}):")
    for m in data["members"]:
        typer.echo(f"  {m['node_id']}  admitted {m['admitted_at'] or 'unknown'}  "
                   f"expires {m['not_after'] or 'never'}"
                   + ("" if m["agent"] is None else f"  agent {m['agent']}"))
    typer.echo(f"revoked ({len(manifest.revoked)}):")
    for r in data["revoked"]:
        when = data["revoked_at"][r]
        typer.echo(f"  {r}" + (f"  revoked {when}" if when else ""))
