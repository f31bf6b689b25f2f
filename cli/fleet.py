"""`peerd fleet init/admit/revoke/show`: the offline admin side of fleet membership.

A fleet directory holds ``admin.key`` (the admin's Ed25519 key, 0600; keep this directory
offline), ``fleet.json`` (fleet id and admin public key: what every node's config needs)
and ``manifest.peerd`` (the current signed manifest, to copy to one node; it then spreads).
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import public_key_bytes, public_key_from_node_id
from peerd.protocol.limits import FLEET_ID_LEN, PUBLIC_KEY_LEN
from peerd.protocol.manifest import (
    MAX_MANIFEST_FILE_LEN,
    Manifest,
    decode_manifest_file,
    encode_manifest_file,
    verify_manifest,
)
from peerd.store.keyfile import KeyFileError, atomic_write, read_private_key, write_private_key

ADMIN_KEY_FILE = "admin.key"
FLEET_FILE = "fleet.json"
MANIFEST_FILE = "manifest.peerd"

app = typer.Typer(
    help="Fleet membership: an admin-signed manifest of who may publish entries.",
    no_args_is_help=True,
)

FleetDir = Annotated[Path, typer.Option("--fleet", help="Fleet directory (from `fleet init`).")]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _read_fleet_file(path: Path) -> tuple[bytes, bytes]:
    """(fleet id, admin public key) from a fleet.json."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        fleet_id = bytes.fromhex(data["fleet_id"])
        admin = bytes.fromhex(data["admin_public_key"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _fail(f"cannot read {path}: {exc}") from None
    if len(fleet_id) != FLEET_ID_LEN or len(admin) != PUBLIC_KEY_LEN:
        raise _fail(f"{path}: fleet_id or admin_public_key has the wrong length")
    return fleet_id, admin


def _read_manifest(path: Path, admin: bytes, fleet_id: bytes) -> Manifest:
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_MANIFEST_FILE_LEN + 1)
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc.strerror}") from None
    try:
        return verify_manifest(decode_manifest_file(data), admin, fleet_id)
    except ProtocolError as exc:
        raise _fail(
            f"manifest {path} is invalid ({exc.code}): {exc.message}; "
            "it may have been tampered with"
        ) from None


def _write_manifest(directory: Path, manifest: Manifest, admin_key: Ed25519PrivateKey) -> None:
    atomic_write(
        directory / MANIFEST_FILE,
        encode_manifest_file(manifest.sign(admin_key)),
        mode=0o644,
        overwrite=True,
    )


def _load_admin(directory: Path) -> tuple[Ed25519PrivateKey, bytes, Manifest]:
    fleet_id, admin_pub = _read_fleet_file(directory / FLEET_FILE)
    try:
        admin_key = read_private_key(directory / ADMIN_KEY_FILE)
    except KeyFileError as exc:
        raise _fail(str(exc)) from None
    if public_key_bytes(admin_key) != admin_pub:
        raise _fail(f"{ADMIN_KEY_FILE} does not match the admin key in {FLEET_FILE}")
    return admin_key, fleet_id, _read_manifest(directory / MANIFEST_FILE, admin_pub, fleet_id)


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
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if (directory / ADMIN_KEY_FILE).exists():
        raise _fail(f"{directory / ADMIN_KEY_FILE} exists: this directory already holds a fleet")
    admin_key = Ed25519PrivateKey.generate()
    fleet_id = secrets.token_bytes(FLEET_ID_LEN)
    write_private_key(directory / ADMIN_KEY_FILE, admin_key)
    info = {"fleet_id": fleet_id.hex(), "admin_public_key": public_key_bytes(admin_key).hex()}
    atomic_write(
        directory / FLEET_FILE,
        (json.dumps(info, indent=2) + "\n").encode(),
        mode=0o644,
        overwrite=True,
    )
    _write_manifest(directory, Manifest(fleet_id=fleet_id, seq=1), admin_key)
    typer.echo(f"fleet id:         {info['fleet_id']}")
    typer.echo(f"admin public key: {info['admin_public_key']}")
    typer.echo(f"manifest:         {directory / MANIFEST_FILE} (seq 1, no members)")


@app.command("admit")
def admit(
    fleet: FleetDir,
    node_id: Annotated[str, typer.Argument(help="Node id (12D3KooW...) from `peerd keygen`.")],
    expires: Annotated[
        str | None, typer.Option("--expires", help="Membership end, ISO 8601 (UTC if no zone).")
    ] = None,
) -> None:
    """Admit (or renew) a node; re-signs the manifest with seq + 1."""
    admin_key, _, manifest = _load_admin(fleet)
    try:
        public_key = public_key_from_node_id(node_id)
    except ProtocolError as exc:
        raise _fail(f"{node_id!r} is not a node id: {exc.message}") from None
    not_after = None if expires is None else _parse_expiry(expires, time.time())
    try:
        manifest = manifest.admit(public_key, not_after)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    _write_manifest(fleet, manifest, admin_key)
    typer.echo(f"admitted {node_id} (manifest seq {manifest.seq})")


@app.command("revoke")
def revoke(
    fleet: FleetDir,
    node_id: Annotated[str, typer.Argument(help="Node id to revoke (permanently).")],
) -> None:
    """Revoke a node for good; re-signs the manifest with seq + 1."""
    admin_key, _, manifest = _load_admin(fleet)
    try:
        public_key_from_node_id(node_id)
        manifest = manifest.revoke(node_id)
    except ProtocolError as exc:
        raise _fail(f"{node_id!r} is not a node id: {exc.message}") from None
    except ValueError as exc:
        raise _fail(str(exc)) from None
    _write_manifest(fleet, manifest, admin_key)
    typer.echo(f"revoked {node_id} (manifest seq {manifest.seq})")


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
    fleet_file = file.parent / FLEET_FILE
    if admin_key is not None:
        try:
            trusted = bytes.fromhex(admin_key)
        except ValueError:
            raise _fail("--admin-key must be hex") from None
        if len(trusted) != PUBLIC_KEY_LEN:
            raise _fail(f"--admin-key must be {PUBLIC_KEY_LEN} bytes")
        trust_source = "--admin-key"
        fleet_id: bytes | None = None
    elif fleet_file.exists():
        fleet_id, trusted = _read_fleet_file(fleet_file)
        trust_source = str(fleet_file)
    else:
        raise _fail(f"no {FLEET_FILE} next to {file}: pass --admin-key to say whom to trust")
    if fleet_id is None:
        # With only an admin key, take the fleet id from the envelope: the signature still
        # binds it (it is part of the signed input), so a forged one fails verification.
        try:
            with file.open("rb") as fh:
                fleet_id = decode_manifest_file(fh.read(MAX_MANIFEST_FILE_LEN + 1)).fleet_id
        except OSError as exc:
            raise _fail(f"cannot read {file}: {exc.strerror}") from None
        except ProtocolError as exc:
            raise _fail(f"manifest {file} is invalid ({exc.code}): {exc.message}") from None
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
