"""`peerd export`: the model out of a state directory, bit for bit, as the docs use it."""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.core.entry import Schema
from peerd.core.validate import ValidationLimits
from peerd.learn import export as ex
from peerd.learn.data import load_dataset
from peerd.learn.tasks import DatasetTask
from peerd.node.state import NodeState, sign_own, verify
from peerd.protocol.identity import node_id_of
from peerd.store import persist
from peerd.store.statedir import StateDir
from tests.node.fleet import FLEET, NOW, key, manifest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
A, B = key(1), key(2)
runner = CliRunner()


def trained_digits_model() -> dict[str, torch.Tensor]:
    """The digits task's model after a few full-batch steps: better than chance, not init."""
    task = DatasetTask("digits", "iid", 0, 1, 0)
    model = task.model()
    data = task.data()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data.X_train), data.y_train)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def node_dir(tmp_path: Path, own: dict[str, torch.Tensor],
             cached: dict[str, torch.Tensor] | None = None) -> Path:
    """A state directory as the daemon writes it: its own entry (and one from B cached)."""
    schema = Schema.of(own)
    node = NodeState(key=A, fleet_id=FLEET, manifest=manifest(A, B), schema=schema,
                     limits=ValidationLimits(), tau_max=600.0, capacity=5)
    state = StateDir(tmp_path / "state")
    held = persist.publish_own(state, node, params=own, version=7, created_at=NOW,
                               num_examples=1437)
    node.set_own(held.entry, held.message, held.frame)
    if cached is not None:
        _, message = sign_own(B, FLEET, params=cached, version=4, created_at=NOW + 5,
                              num_examples=12)
        v = verify(message, fleet_id=FLEET, manifest=node.manifest, ledger=node.ledger.view(),
                   schema=schema, limits=node.limits, now=NOW + 6)
        assert node.accept(v, sender=node_id_of(B), now=NOW + 6) is None
        persist.save_cache(state, node, set())
    node.release()
    return state.path


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bytes(
        a.contiguous().view(torch.uint8).numpy()) == bytes(b.contiguous().view(torch.uint8).numpy())


def ok(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def fails(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    return result.output


def snippet() -> str:
    text = DOCS.read_text()
    start = text.index("<!-- export-snippet")
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match is not None
    return match.group(1)


def test_the_export_is_the_nodes_model_bit_for_bit_and_the_docs_snippet_predicts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params = trained_digits_model()
    state = node_dir(tmp_path, params)
    out = tmp_path / "work" / "model.safetensors"
    out.parent.mkdir()
    ok("export", "--state-dir", str(state), "--out", str(out))
    exported = load_file(out)
    assert exported.keys() == params.keys()
    assert all(same_bits(exported[k], params[k]) for k in params)
    with safe_open(str(out), framework="pt") as f:
        meta = f.metadata()
    assert meta["origin"] == node_id_of(A)
    assert meta["version"] == "7"
    assert float(meta["created_at_unix"]) == NOW
    assert meta["created_at"].startswith("2027-01-15T08:00:00")
    assert meta["schema"] == Schema.of(params).id
    assert meta["task"] == "unknown"  # no config given
    # The signed digest is the SHA-256 of the tensors in name order: the file proves itself.
    payload = b"".join(bytes(exported[k].view(torch.uint8).numpy()) for k in sorted(exported))
    assert hashlib.sha256(payload).hexdigest() == meta["payload_sha256"]

    # The documented snippet, as a user would run it beside the file.
    test = load_dataset("digits")
    model = DatasetTask("digits", "iid", 0, 1, 0).model()
    model.load_state_dict(params)
    with torch.no_grad():
        expected = (model(test.x_test).argmax(1) == test.y_test).float().mean().item()
    assert expected > 0.5
    monkeypatch.chdir(out.parent)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(snippet(), "docs/operations.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    assert f"'origin': '{node_id_of(A)}'" in lines[0]
    assert lines[-1] == f"accuracy {expected}"


def test_a_cached_origin_by_its_short_id(tmp_path: Path) -> None:
    own, theirs = trained_digits_model(), {k: v + 1.0 for k, v in trained_digits_model().items()}
    state = node_dir(tmp_path, own, cached=theirs)
    out = tmp_path / "peer.safetensors"
    text = ok("export", "--state-dir", str(state), "--origin", "…" + node_id_of(B)[-6:],
              "--out", str(out))
    assert f"cached model of {node_id_of(B)}, version 4" in text
    exported = load_file(out)
    assert all(same_bits(exported[k], theirs[k]) for k in theirs)
    # The node's own id works as --origin too.
    ok("export", "--state-dir", str(state), "--origin", node_id_of(A), "--out", str(out))
    assert all(same_bits(load_file(out)[k], own[k]) for k in own)
    assert "is not a cached origin" in fails("export", "--state-dir", str(state), "--origin",
                                             "zzzzzz", "--out", str(out))


def test_onnx_predicts_what_torch_predicts(tmp_path: Path) -> None:
    onnx_reference = pytest.importorskip("onnx.reference")
    import onnx

    params = trained_digits_model()
    model = ex.read_model(node_dir(tmp_path, params))
    task = DatasetTask("digits", "iid", 0, 1, 0)
    out = tmp_path / "model.onnx"
    ex.write_onnx(model, out, task)
    proto = onnx.load(str(out))
    assert {p.key: p.value for p in proto.metadata_props}["origin"] == node_id_of(A)
    x = task.data().X_val[:50]
    (logits,) = onnx_reference.ReferenceEvaluator(proto).run(None, {"input": x.numpy()})
    reference = task.model()
    reference.load_state_dict(params)
    with torch.no_grad():
        expected = reference(x).numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    assert (logits.argmax(1) == expected.argmax(1)).all()


def test_nothing_to_export_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    StateDir(empty)
    assert "no model in" in fails("export", "--state-dir", str(empty))
    assert "no state directory" in fails("export", "--state-dir", str(tmp_path / "none"))
    assert "--format must be one of" in fails("export", "--state-dir", str(empty),
                                              "--format", "pickle")
    state = node_dir(tmp_path, trained_digits_model())
    assert "give the node's config" in fails("export", "--state-dir", str(state),
                                             "--format", "onnx")


def test_a_tampered_entry_is_refused_not_exported(tmp_path: Path) -> None:
    state = node_dir(tmp_path, trained_digits_model())
    path = state / "blobs" / persist.OWN_BLOB
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # a flipped bit in the last tensor
    path.write_bytes(bytes(data))
    assert "corrupt" in fails("export", "--state-dir", str(state),
                              "--out", str(tmp_path / "m.safetensors"))
    assert not (tmp_path / "m.safetensors").exists()
    assert path.exists()  # read-only: not quarantined from under a running daemon


def test_an_entry_rewritten_with_a_valid_checksum_still_fails_its_signature(
        tmp_path: Path) -> None:
    state_path = node_dir(tmp_path, trained_digits_model())
    state = StateDir(state_path)
    body = bytearray(state.read_blob(persist.OWN_BLOB) or b"")
    body[-1] ^= 0x01  # a changed weight, re-wrapped in a correct state-file header
    state.write_blob(persist.OWN_BLOB, bytes(body))
    assert "differs from the one its origin signed" in fails(
        "export", "--state-dir", str(state_path), "--out", str(tmp_path / "m.safetensors"))
    assert not (tmp_path / "m.safetensors").exists()


def test_the_state_dir_from_the_environment_and_a_default_file_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params = trained_digits_model()
    state = node_dir(tmp_path, params)
    monkeypatch.setenv("PEERD_STATE_DIR", str(state))
    monkeypatch.setattr("peerd.daemon.config.DEFAULT_CONFIG_PATH", tmp_path / "no.toml")
    monkeypatch.chdir(tmp_path)
    ok("export")
    written = tmp_path / f"model-{node_id_of(A)[-6:]}-v7.safetensors"
    assert all(same_bits(load_file(written)[k], params[k]) for k in params)
