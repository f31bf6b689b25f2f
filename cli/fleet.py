"""`peerd fleet init/admit/revoke/show`: the offline admin side of fleet membership.

A fleet directory holds ``admin.key`` (the admin's Ed25519 key, 0600; keep this directory
offline), ``fleet.json`` (fleet id and admin public key: what every node's config needs)
and ``manifest.peerd`` (the current signed manifest, to copy to one node; it then spreads).
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
from peerd.protocol.limits import PUBLIC_KEY_LEN
from peerd.protocol.manifest import Manifest
from peerd.store import fleetdir
from peerd.store.fleetdir import FLEET_FILE, FleetAdmin, FleetDirError, ManifestError

app = typer.Typer(
    help="Fleet membership: an admin-signed manifest of who may publish entries.",
    no_args_is_help=True,
)

FleetDir = Annotated[Path, typer.Option("--fleet", help="Fleet directory (from `fleet init`).")]


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


@app.command("init")
def init(directory: Annotated[Path, typer.Argument(help="New fleet directory.")]) -> None:
    """Create a fleet: admin key, fleet id and an empty manifest (seq 1)."""
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
    node_id: Annotated[str, typer.Argument(help="Node id (12D3KooW...) from `peerd keygen`.")],
    expires: Annotated[
        str | None, typer.Option("--expires", help="Membership end, ISO 8601 (UTC if no zone).")
    ] = None,
) -> None:
    """Admit (or renew) a node; re-signs the manifest with seq + 1."""
    admin = _load_admin(fleet)
    try:
        public_key = public_key_from_node_id(node_id)
    except ProtocolError as exc:
        raise _fail(f"{node_id!r} is not a node id: {exc.message}") from None
    not_after = None if expires is None else _parse_expiry(expires, time.time())
    try:
        admin = admin.admit(public_key, not_after)
    except (ValueError, FleetDirError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"admitted {node_id} (manifest seq {admin.fleet.manifest.seq})")


@app.command("revoke")
def revoke(
    fleet: FleetDir,
    node_id: Annotated[str, typer.Argument(help="Node id to revoke (permanently).")],
) -> None:
    """Revoke a node for good; re-signs the manifest with seq + 1."""
    admin = _load_admin(fleet)
    try:
        public_key_from_node_id(node_id)
        admin = admin.revoke(node_id)
    except ProtocolError as exc:
        raise _fail(f"{node_id!r} is not a node id: {exc.message}") from None
    except (ValueError, FleetDirError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"revoked {node_id} (manifest seq {admin.fleet.manifest.seq})")


def _iso(stamp: float | None) -> str | None:
    return None if stamp is None else datetime.fromtimestamp(stamp, UTC).isoformat()


@app.command("show")
def show(
    file: Annotated[Path, typer.Argument(help="Manifest file (e.g. FLEET/manifest.peerd).")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    admin_key: Annotated[
        str | None, typer.Option("--admin-key", help="Trusted admin public key (hex).")
    ] = None,
) -> None:
    """Verify a manifest and print it; a tampered or foreign manifest exits non-zero."""
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
    data: dict[str, Any] = {
        "fleet_id": manifest.fleet_id.hex(),
        "seq": manifest.seq,
        "admin_public_key": trusted.hex(),
        "verified_against": trust_source,
        "members": [
            {"node_id": m.node_id, "public_key": m.public_key.hex(), "not_after": _iso(m.not_after)}
            for m in manifest.members
        ],
        "revoked": sorted(manifest.revoked),
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
        typer.echo(f"  {m['node_id']}  expires {m['not_after'] or 'never'}")
    typer.echo(f"revoked ({len(manifest.revoked)}):")
    for r in data["revoked"]:
        typer.echo(f"  {r}")
