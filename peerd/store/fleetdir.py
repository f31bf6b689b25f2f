"""The fleet directory: where the fleet admin keeps membership, offline.

Layout, as ``peerd fleet init`` makes it::

    admin.key        the admin's Ed25519 key (0600; keep this directory offline)
    fleet.json       fleet id and admin public key, hex (0644): what every node's config needs
    manifest.peerd   the current signed manifest (0644; copy it to one node, it spreads)
    admissions.json  when each member was admitted (or revoked): the admin's own record

Owns these four files and nothing else: creating them, reading them with one set of limits
and one set of messages, changing membership (a change re-signs the manifest, seq + 1; a
request that changes nothing writes nothing), and copying the verified manifest next to a
node's config.

The signed manifest carries no admission times (the wire format has none, and nodes need
none: membership is checked against ``not_after`` only). ``admissions.json`` is therefore
a local, unsigned record kept beside it, written after each change that this code made; a
member admitted before the record existed, or by other tooling, shows as "unknown".

``peerd fleet``, ``peerd init``, the demo mesh and the benchmarks all go through here; no
other module writes these files (a daemon only reads the manifest its config names).

It must not sign, verify or encode a manifest itself (peerd.protocol.manifest does), write a
file except through peerd.store.statefile / peerd.store.keyfile, nor print or exit: a
:class:`FleetDirError` carries the message and the caller decides how to report it.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.protocol.envelope import SignedEnvelope
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import node_id_from_public_key, node_id_of, public_key_bytes
from peerd.protocol.limits import FLEET_ID_LEN, PUBLIC_KEY_LEN
from peerd.protocol.manifest import (
    MAX_MANIFEST_FILE_LEN,
    Manifest,
    decode_manifest_file,
    encode_manifest_file,
    verify_manifest,
)
from peerd.store.keyfile import KeyFileError, new_node_key, read_private_key, write_private_key
from peerd.store.statefile import atomic_write_raw

ADMIN_KEY_FILE = "admin.key"
FLEET_FILE = "fleet.json"
MANIFEST_FILE = "manifest.peerd"
ADMISSIONS_FILE = "admissions.json"
#: Largest admissions.json read: a record per member and revoked id (MAX_MEMBERS +
#: MAX_REVOKED, ~200 bytes each) fits many times over; a bigger file is not ours.
MAX_ADMISSIONS_FILE_LEN = 1024 * 1024
#: Largest fleet.json read: it holds two hex strings; anything big is not ours.
MAX_FLEET_FILE_LEN = 64 * 1024
#: fleet.json and manifests are public (the member list is signed, not secret): readable
#: like /etc files, so a node's service user can read its copy.
PUBLIC_MODE = 0o644
#: seq of a new fleet's first manifest, whoever it admits.
FIRST_SEQ = 1


class FleetDirError(Exception):
    """A fleet directory (or manifest file) that cannot be used; str() says why, for the
    operator, naming the file."""


class ManifestError(FleetDirError):
    """A manifest file that does not decode or does not verify against the trusted key."""

    def __init__(self, path: Path, exc: ProtocolError) -> None:
        super().__init__(f"manifest {path} is invalid ({exc.code}): {exc.message}")
        self.path = path
        self.code = exc.code
        self.detail = exc.message


@dataclass(frozen=True, slots=True)
class FleetInfo:
    """``fleet.json``: whom every member trusts (the admin key) and for which fleet."""

    fleet_id: bytes
    admin_public_key: bytes

    def to_json(self) -> bytes:
        info = {"fleet_id": self.fleet_id.hex(), "admin_public_key": self.admin_public_key.hex()}
        return (json.dumps(info, indent=2) + "\n").encode()


@dataclass(frozen=True, slots=True)
class Fleet:
    """A fleet directory as read: ``fleet.json`` and the manifest verified against it."""

    directory: Path
    info: FleetInfo
    manifest: Manifest
    #: The manifest file's bytes as read and verified: what a node's copy holds.
    manifest_data: bytes

    @property
    def manifest_path(self) -> Path:
        return self.directory / MANIFEST_FILE

    def config_section(self) -> dict[str, str]:
        """A node config's ``[fleet]`` section pointing at this directory's manifest."""
        return {"admin_public_key": self.info.admin_public_key.hex(),
                "fleet_id": self.info.fleet_id.hex(), "manifest": str(self.manifest_path)}


@dataclass(frozen=True, slots=True)
class Admission:
    """What ``admissions.json`` says of one node id (None: not recorded)."""

    admitted_at: float | None = None
    #: The manifest seq that first admitted it.
    admitted_seq: int | None = None
    revoked_at: float | None = None


@dataclass(frozen=True, slots=True)
class Change:
    """The outcome of an admit or revoke: what changed, for the operator."""

    node_id: str
    #: "admitted", "renewed" (expiry changed), "revoked", or "unchanged"
    what: str
    #: Why nothing changed ("already a member ..."), or what the renewal changed.
    detail: str = ""
    #: The member's previous expiry (renewals).
    previous_not_after: float | None = None

    @property
    def changed(self) -> bool:
        return self.what != "unchanged"


@dataclass(frozen=True, slots=True)
class FleetAdmin:
    """A fleet directory opened with its admin key: membership can change."""

    fleet: Fleet
    key: Ed25519PrivateKey

    def admit(self, public_key: bytes, not_after: float | None, *, now: float,
              agent: int | None = None) -> tuple[FleetAdmin, Change]:
        """Admit a key until ``not_after`` (None: no expiry), or renew a member whose expiry
        (or cordial ``agent`` binding) differs; the manifest is re-signed with seq + 1 and
        written, and the admission time ``now`` recorded. ``agent`` None keeps a member's
        binding. A member with that very expiry and binding changes nothing (no new seq).
        ValueError for a revoked key (never re-admitted), a full manifest or an agent bound
        to another member; FleetDirError when a file cannot be written."""
        node_id = node_id_from_public_key(public_key)
        held = self.fleet.manifest.member(node_id)
        if held is not None and agent is None:
            agent = held.agent
        if held is not None and held.not_after == not_after and held.agent == agent:
            return self, Change(node_id, "unchanged", "already a member with that expiry")
        admin = self._write(self.fleet.manifest.admit(public_key, not_after, agent))
        if held is not None:
            return admin, Change(node_id, "renewed", previous_not_after=held.not_after)
        admin._record(node_id, Admission(admitted_at=now, admitted_seq=admin.fleet.manifest.seq))
        return admin, Change(node_id, "admitted")

    def revoke(self, node_id: str, *, now: float) -> tuple[FleetAdmin, Change]:
        """Revoke a member for good; re-signed with seq + 1 and written (as :meth:`admit`).
        An id already revoked, or never admitted, changes nothing (no new seq): a stranger
        is refused anyway, and revoking it would only grow the manifest."""
        manifest = self.fleet.manifest
        if node_id in manifest.revoked:
            return self, Change(node_id, "unchanged", "already revoked")
        if manifest.member(node_id) is None:
            return self, Change(node_id, "unchanged", "not a member")
        admin = self._write(manifest.revoke(node_id))
        admin._record(node_id, Admission(revoked_at=now), keep_admission=True)
        return admin, Change(node_id, "revoked")

    def _write(self, manifest: Manifest) -> FleetAdmin:
        data = _write_manifest(self.fleet.manifest_path, manifest, self.key)
        fleet = dataclasses.replace(self.fleet, manifest=manifest, manifest_data=data)
        return dataclasses.replace(self, fleet=fleet)

    def _record(self, node_id: str, admission: Admission, *,
                keep_admission: bool = False) -> None:
        # After the manifest: the manifest is what counts, the record only adds detail; a
        # failure here says so rather than pretend the change did not happen.
        try:
            records = read_admissions(self.fleet.directory)
            if keep_admission and node_id in records:
                admission = dataclasses.replace(records[node_id], revoked_at=admission.revoked_at)
            records[node_id] = admission
            _write_admissions(self.fleet.directory, records)
        except FleetDirError as exc:
            raise FleetDirError(f"the manifest was changed (seq {self.fleet.manifest.seq}) but "
                                f"its admission record was not: {exc}") from None


# ---------------------------------------------------------------------------- reading


def has_info(directory: Path) -> bool:
    """Whether ``directory`` holds a ``fleet.json`` (e.g. beside a manifest being shown)."""
    return (directory / FLEET_FILE).exists()


def read_info(directory: Path) -> FleetInfo:
    """``directory/fleet.json``; FleetDirError when missing, unreadable or malformed."""
    path = directory / FLEET_FILE
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_FLEET_FILE_LEN + 1)
        if len(raw) > MAX_FLEET_FILE_LEN:
            raise ValueError(f"over {MAX_FLEET_FILE_LEN} bytes: not a fleet file")
        data = json.loads(raw)
        info = FleetInfo(fleet_id=bytes.fromhex(data["fleet_id"]),
                         admin_public_key=bytes.fromhex(data["admin_public_key"]))
    except FileNotFoundError:
        raise FleetDirError(f"no {FLEET_FILE} in {directory}: is it a fleet directory "
                            "(`peerd fleet init DIR`)?") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FleetDirError(f"cannot read {path}: {exc}") from None
    if len(info.fleet_id) != FLEET_ID_LEN or len(info.admin_public_key) != PUBLIC_KEY_LEN:
        raise FleetDirError(f"{path}: fleet_id or admin_public_key has the wrong length")
    return info


def _read_manifest_file(path: Path) -> tuple[bytes, SignedEnvelope]:
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_MANIFEST_FILE_LEN + 1)  # one over: decoding refuses it
    except OSError as exc:
        raise FleetDirError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return data, decode_manifest_file(data)
    except ProtocolError as exc:
        raise ManifestError(path, exc) from None


def read_manifest_envelope(path: Path) -> SignedEnvelope:
    """A manifest file decoded, not verified (its fleet id, when only the admin key is
    trusted: the signature binds it). FleetDirError / ManifestError."""
    return _read_manifest_file(path)[1]


def read_manifest(path: Path, admin_public_key: bytes, fleet_id: bytes) -> Manifest:
    """A manifest file verified against the trusted admin key and fleet id.

    ManifestError (with the protocol's code) when it does not decode or verify: tampered,
    signed by someone else, or another fleet's; FleetDirError when it cannot be read.
    """
    return _verified(path, *_read_manifest_file(path), admin_public_key, fleet_id)[0]


def _verified(path: Path, data: bytes, envelope: SignedEnvelope, admin_public_key: bytes,
              fleet_id: bytes) -> tuple[Manifest, bytes]:
    try:
        return verify_manifest(envelope, admin_public_key, fleet_id), data
    except ProtocolError as exc:
        raise ManifestError(path, exc) from None


def open_fleet(directory: Path) -> Fleet:
    """``fleet.json`` and the manifest verified against it (no admin key needed)."""
    info = read_info(directory)
    path = directory / MANIFEST_FILE
    manifest, data = _verified(path, *_read_manifest_file(path), info.admin_public_key,
                               info.fleet_id)
    return Fleet(directory, info, manifest, data)


def open_admin(directory: Path) -> FleetAdmin:
    """The fleet with its admin key, checked against ``fleet.json``, ready to change."""
    info = read_info(directory)
    try:
        key = read_private_key(directory / ADMIN_KEY_FILE)
    except KeyFileError as exc:
        raise FleetDirError(str(exc)) from None
    if public_key_bytes(key) != info.admin_public_key:
        raise FleetDirError(f"{ADMIN_KEY_FILE} does not match the admin key in {FLEET_FILE}")
    path = directory / MANIFEST_FILE
    manifest, data = _verified(path, *_read_manifest_file(path), info.admin_public_key,
                               info.fleet_id)
    return FleetAdmin(Fleet(directory, info, manifest, data), key)


def _number(value: object) -> float | None:
    # JSON true/false decode as bool, an int subclass: not a time.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def read_admissions(directory: Path) -> dict[str, Admission]:
    """``directory/admissions.json``: node id -> what it records; empty when absent.
    Unreadable or malformed: FleetDirError (the admin should see it, not lose it)."""
    path = directory / ADMISSIONS_FILE
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_ADMISSIONS_FILE_LEN + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise FleetDirError(f"cannot read {path}: {exc.strerror}") from None
    try:
        if len(raw) > MAX_ADMISSIONS_FILE_LEN:
            raise ValueError(f"over {MAX_ADMISSIONS_FILE_LEN} bytes")
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise FleetDirError(f"cannot read {path}: {exc}") from None
    out: dict[str, Admission] = {}
    for node_id, item in data.items():
        item = item if isinstance(item, dict) else {}
        seq = item.get("admitted_seq")
        out[str(node_id)] = Admission(
            admitted_at=_number(item.get("admitted_at")),
            admitted_seq=seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
            revoked_at=_number(item.get("revoked_at")))
    return out


# ---------------------------------------------------------------------------- writing


def _write_admissions(directory: Path, records: Mapping[str, Admission]) -> None:
    body = {node_id: {"admitted_at": a.admitted_at, "admitted_seq": a.admitted_seq,
                      "revoked_at": a.revoked_at}
            for node_id, a in sorted(records.items())}
    _write_public(directory / ADMISSIONS_FILE, (json.dumps(body, indent=2) + "\n").encode())


def _write_public(path: Path, data: bytes) -> None:
    try:
        atomic_write_raw(path, data, mode=PUBLIC_MODE, overwrite=True)
    except OSError as exc:
        raise FleetDirError(f"cannot write {path}: {exc.strerror}") from None


def _write_manifest(path: Path, manifest: Manifest, admin_key: Ed25519PrivateKey) -> bytes:
    data = encode_manifest_file(manifest.sign(admin_key))
    _write_public(path, data)
    return data


def create(directory: Path, *, members: Sequence[bytes] = (),
           agents: Sequence[int | None] = (), now: float | None = None
           ) -> FleetAdmin:
    """A new fleet in ``directory`` (made 0700 if missing): a fresh admin key and fleet id
    and a manifest (seq 1) admitting the public keys ``members`` (none by default).

    FleetDirError when ``directory`` already holds a fleet (nothing is changed then) or a
    file cannot be written.
    """
    key_path = directory / ADMIN_KEY_FILE
    exists = FleetDirError(f"{key_path} exists: this directory already holds a fleet")
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if key_path.exists():
            raise exists
        admin_key = Ed25519PrivateKey.generate()
        write_private_key(key_path, admin_key)  # refuses to replace: one admin key per fleet
    except FileExistsError:
        raise exists from None
    except OSError as exc:
        raise FleetDirError(f"cannot create a fleet in {directory}: {exc.strerror}") from None
    info = FleetInfo(secrets.token_bytes(FLEET_ID_LEN), public_key_bytes(admin_key))
    _write_public(directory / FLEET_FILE, info.to_json())
    manifest = Manifest(info.fleet_id, 0)
    for i, public_key in enumerate(members):
        manifest = manifest.admit(public_key, None, agents[i] if i < len(agents) else None)
    manifest = dataclasses.replace(manifest, seq=FIRST_SEQ)
    data = _write_manifest(directory / MANIFEST_FILE, manifest, admin_key)
    stamp = time.time() if now is None else now
    _write_admissions(directory, {m.node_id: Admission(stamp, FIRST_SEQ)
                                  for m in manifest.members})
    return FleetAdmin(Fleet(directory, info, manifest, data), admin_key)


def create_with_nodes(directory: Path, state_dirs: Sequence[Path]) -> tuple[Fleet, list[str]]:
    """A throw-away fleet (the demo's, the benchmarks'): a fresh identity key in each of
    ``state_dirs`` (as ``node.key``), all admitted by the fleet made in ``directory``, node
    i bound to cordial agent i (its ``[task] node_index``; harmless outside cordial mode).
    The fleet and the node ids, in the order of ``state_dirs``."""
    keys = [new_node_key(d) for d in state_dirs]
    admin = create(directory, members=[public_key_bytes(k) for k in keys],
                   agents=range(len(keys)))
    return admin.fleet, [node_id_of(k) for k in keys]


def install_manifest(fleet: Fleet, target: Path) -> None:
    """Write the fleet's verified manifest to ``target`` (next to a node's config),
    atomically and 0644; nothing to do when ``target`` is the fleet's own file.
    FleetDirError when it cannot be written."""
    if target.resolve() == fleet.manifest_path.resolve():
        return
    _write_public(target, fleet.manifest_data)
