"""Taking a trained model out of a state directory: safetensors, or ONNX.

A node's model exists only as a signed entry frame in its state directory (``own.entry``;
a cached origin's as ``entry-<origin>``). :func:`read_model` reads one offline, beside a
daemon that may be running (read-only: nothing is created, cleaned or quarantined), and
checks what can be checked without the fleet's manifest: the state file's checksum, the
origin's signature over the body (the signer's key must be the origin's id), and the
payload's SHA-256 against the signed one. Membership and the version ledger are the
daemon's business and were checked when the entry was admitted. The tensors are decoded with
``numpy.frombuffer`` (peerd.protocol.tensors): never pickle, never ``torch.load``.

:func:`write_safetensors` writes the tensors exactly as signed (bit for bit) with string
metadata: origin, version, created_at, schema, task, and the signed payload digest that ties
the file to its entry. :func:`write_onnx` loads them into the task's own architecture and
traces it (torch's TorchScript-based exporter: it needs no ``onnxscript``); a model that
cannot be traced gets an :class:`ExportError` saying so.

Owns the model file formats only; the state-file and entry formats are peerd.store's and
peerd.protocol's, and this module never writes into a state directory.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

from peerd.learn.tasks import Task
from peerd.node.wirearrays import from_wire_arrays
from peerd.protocol import messages as msg
from peerd.protocol.entry import EntryBody
from peerd.protocol.envelope import ENTRY_DOMAIN
from peerd.protocol.errors import ProtocolError
from peerd.protocol.identity import node_id_from_public_key
from peerd.protocol.tensors import decode_tensors
from peerd.store.persist import OWN_BLOB
from peerd.store.statedir import ENTRY_BLOB_PREFIX, StateDir
from peerd.store.statefile import atomic_write_raw

#: The metadata key naming this file's layout, and its value: readers can tell versions apart.
FORMAT_KEY = "format"
FORMAT = "peerd-model-v1"
FORMATS = ("safetensors", "onnx")
#: The ONNX opset written: old enough for every current runtime, new enough for the ops a
#: small torch model uses.
ONNX_OPSET = 17
#: Shortest unique tail accepted for ``--origin`` (a node id's first 8 characters are shared).
MIN_ORIGIN_SUFFIX = 4


class ExportError(Exception):
    """The model cannot be exported; str() says why, for the operator."""


@dataclass(frozen=True, slots=True)
class StoredModel:
    """One model as a state directory holds it, verified as the module docstring says."""

    origin: str
    version: int
    created_at: float
    schema_id: str
    num_examples: int
    fleet_id: bytes
    #: SHA-256 (hex) of the payload, as signed by the origin.
    digest: str
    #: Whether it is the node's own model (``own.entry``) rather than a cached one.
    own: bool
    #: name -> tensor, the exact signed bytes (a copy: the file's buffer is not kept alive).
    params: dict[str, torch.Tensor]


def _entry_files(state: StateDir) -> dict[str, tuple[str, bool]]:
    """origin (as named by its file) -> (blob name, own); the own entry under its key ""."""
    files = {name.removeprefix(ENTRY_BLOB_PREFIX): (name, False)
             for name in state.list_blobs(ENTRY_BLOB_PREFIX)}
    if state.blob_path(OWN_BLOB).exists():
        files[""] = (OWN_BLOB, True)
    return files


def _decode(state: StateDir, blob: str, own: bool) -> StoredModel:
    path = state.blob_path(blob)
    body = state.read_blob(blob)
    if body is None:
        raise ExportError(f"{path} is missing or fails its checksum (corrupt); nothing exported")
    try:
        message = msg.decode_frame(body)
        if not isinstance(message, msg.Entry):
            raise ExportError(f"{path} does not hold an entry")
        env = message.envelope
        entry = EntryBody.from_bytes(env.verify(ENTRY_DOMAIN, env.fleet_id))
        if node_id_from_public_key(env.key) != entry.origin:
            raise ExportError(f"{path}: signed by a key that is not its origin's")
        # getattr: entry kinds (weights, knowledge, ...) are newer than some state files.
        kind = getattr(entry, "kind", "weights")
        if kind != "weights":
            raise ExportError(f"{path} holds a {kind} entry, not model weights")
        payload = message.payload
        if len(payload) != entry.payload_len or \
                hashlib.sha256(payload).hexdigest() != entry.digest:
            raise ExportError(f"{path}: the payload differs from the one its origin signed")
        arrays = decode_tensors(entry.tensors, payload)
    except ProtocolError as exc:
        raise ExportError(f"{path} is not a valid signed entry ({exc.code}): {exc.message}")\
            from None
    with warnings.catch_warnings():  # read-only views, copied right away
        warnings.simplefilter("ignore", UserWarning)
        params = {k: v.clone() for k, v in from_wire_arrays(entry.tensors, arrays).items()}
    return StoredModel(origin=entry.origin, version=entry.version, created_at=entry.created_at,
                       schema_id=entry.schema_id, num_examples=entry.num_examples,
                       fleet_id=entry.fleet_id, digest=entry.digest, own=own, params=params)


def origins(state_dir: Path) -> list[str]:
    """The cached origins a state directory holds entries of (by file name, unverified)."""
    return sorted(o for o in _entry_files(StateDir(state_dir, readonly=True)) if o)


def read_model(state_dir: Path, origin: str | None = None) -> StoredModel:
    """The node's own model (``origin`` None or the node's id), or a cached origin's (its
    id, or a unique tail of at least :data:`MIN_ORIGIN_SUFFIX` characters, e.g. the six
    that `peerd status` shows). ExportError when there is none or it does not verify."""
    if not state_dir.is_dir():
        raise ExportError(f"no state directory at {state_dir}")
    state = StateDir(state_dir, readonly=True)
    files = _entry_files(state)
    if origin is None:
        if "" not in files:
            raise ExportError(f"no model in {state_dir} yet: the node publishes its own after "
                              "its first round (or pass --origin ID for a cached one)")
        return _decode(state, *files[""])
    wanted = origin.lstrip("…")
    own = _decode(state, *files[""]) if "" in files else None
    if own is not None and own.origin.endswith(wanted) and len(wanted) >= MIN_ORIGIN_SUFFIX:
        return own
    matches = [o for o in files if o and o.endswith(wanted)]
    if len(wanted) < MIN_ORIGIN_SUFFIX or len(matches) != 1:
        known = ", ".join(o for o in sorted(files) if o) or "none"
        what = "matches several" if len(matches) > 1 else "is not"
        raise ExportError(f"--origin {origin} {what} a cached origin in {state_dir} "
                          f"(cached: {known})")
    model = _decode(state, *files[matches[0]])
    if model.origin != matches[0]:
        raise ExportError(f"{state.blob_path(files[matches[0]][0])} holds {model.origin}'s "
                          "entry, not its file name's")
    return model


def metadata(model: StoredModel, task: str | None) -> dict[str, str]:
    """The safetensors header's metadata (strings only, as the format requires)."""
    return {
        FORMAT_KEY: FORMAT,
        "origin": model.origin,
        "version": str(model.version),
        "created_at": datetime.fromtimestamp(model.created_at, UTC).isoformat(),
        "created_at_unix": repr(model.created_at),
        "schema": model.schema_id,
        "task": task or "unknown",
        "num_examples": str(model.num_examples),
        "fleet_id": model.fleet_id.hex(),
        "payload_sha256": model.digest,
    }


def _write(out: Path, data: bytes) -> None:
    try:
        atomic_write_raw(out, data, mode=0o644, overwrite=True)
    except OSError as exc:
        raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from None


def write_safetensors(model: StoredModel, out: Path, *, task: str | None) -> None:
    """``out`` as safetensors: the tensors as signed, and :func:`metadata`."""
    from safetensors.torch import save

    tensors = {k: v.contiguous() for k, v in model.params.items()}
    _write(out, save(tensors, metadata=metadata(model, task)))


def load_into(module: torch.nn.Module, params: Mapping[str, torch.Tensor]) -> None:
    """``params`` into ``module`` (strict: the task must build the architecture it signed)."""
    try:
        module.load_state_dict(dict(params), strict=True)
    except RuntimeError as exc:
        raise ExportError(f"the task's model does not match the stored one: {exc}") from None


def write_onnx(model: StoredModel, out: Path, task: Task) -> None:
    """``out`` as ONNX: the task's architecture with the stored weights, traced on one
    validation example, with a dynamic batch axis; metadata as in :func:`metadata`."""
    import onnx

    module = task.model()
    load_into(module, model.params)
    module.eval()
    example = task.data().X_val[:1]
    if len(example) == 0:
        raise ExportError("the task has no validation example to trace the model with")
    with tempfile.TemporaryDirectory(prefix="peerd-export-") as tmp:
        traced = Path(tmp) / "model.onnx"
        try:
            with warnings.catch_warnings():
                # The TorchScript-based exporter is deprecated in favour of one that needs
                # onnxscript, and tracing warns about every Python branch; for the small
                # feed-forward models a task trains, the trace is the model.
                warnings.simplefilter("ignore")
                torch.onnx.export(module, (example,), traced, dynamo=False,
                                  opset_version=ONNX_OPSET, input_names=["input"],
                                  output_names=["output"],
                                  dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
        except Exception as exc:  # noqa: BLE001 - tracing fails in many ways; all mean "cannot"
            raise ExportError(f"the task's model cannot be traced to ONNX: {exc}") from None
        proto = onnx.load(str(traced))
    for key, value in metadata(model, task.name).items():
        proto.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(proto)
    _write(out, proto.SerializeToString())


def default_out(model: StoredModel, fmt: str) -> Path:
    """``model-<last 6 of origin>-v<version>.<ext>`` in the working directory."""
    ext = "onnx" if fmt == "onnx" else "safetensors"
    return Path(os.curdir) / f"model-{model.origin[-6:]}-v{model.version}.{ext}"
