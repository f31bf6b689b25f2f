"""Entries: schema id, payload digest, flat layout, provenance kept outside the signed part."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import torch

from peerd.core.entry import CacheItem, Entry, EntryMeta, Schema, flatten, payload_digest, unflatten


def model() -> dict[str, torch.Tensor]:
    return {"b": torch.arange(3, dtype=torch.float32), "a": torch.ones(2, 2, dtype=torch.float16),
            "n": torch.tensor(7, dtype=torch.int64)}


def test_schema_id_depends_on_names_shapes_and_dtypes_not_values_or_insertion_order() -> None:
    m = model()
    same = {k: torch.zeros_like(v) for k, v in reversed(list(m.items()))}
    assert Schema.of(m).id == Schema.of(same).id
    assert Schema.of({**m, "b": torch.zeros(4)}).id != Schema.of(m).id
    assert Schema.of({**m, "b": torch.zeros(3, dtype=torch.float64)}).id != Schema.of(m).id
    assert Schema.of({**m, "c": m.pop("b")}).id != Schema.of(model()).id
    assert len(Schema.of(model()).id) == 64


def test_payload_digest_is_sha256_of_sorted_little_endian_bytes() -> None:
    m = model()
    raw = b"".join(m[k].contiguous().numpy().astype(m[k].numpy().dtype.newbyteorder("<")).tobytes()
                   for k in sorted(m))
    assert payload_digest(m) == hashlib.sha256(raw).hexdigest()
    assert payload_digest({"w": torch.zeros(2, dtype=torch.bfloat16)}) == hashlib.sha256(
        b"\0" * 4).hexdigest()


def test_entry_create_stamps_schema_and_digest() -> None:
    e = Entry.create(origin="C1", version=5, created_at=1.5, num_examples=10, params=model())
    assert e.meta == EntryMeta("C1", 5, 1.5, Schema.of(model()).id, 10, payload_digest(model()))


def test_provenance_is_not_part_of_what_the_origin_vouches_for() -> None:
    fields = {f.name for f in dataclasses.fields(EntryMeta)}
    assert "received_from" not in fields
    assert "received_at" not in fields
    meta = Entry.create(origin="C3", version=2, created_at=0, num_examples=1, params=model()).meta
    via_c2 = CacheItem(meta, received_from="C2", received_at=10.0)
    via_c4 = CacheItem(meta, received_from="C4", received_at=11.0)
    assert via_c2.meta == via_c4.meta  # relaying changes provenance only


def test_flatten_unflatten_round_trip_keeps_dtypes_and_integer_buffers() -> None:
    m = model()
    schema = Schema.of(m)
    vec = flatten(m, schema)
    assert vec.dtype == torch.float32
    assert vec.shape == (7,)  # 4 (a) + 3 (b), n not included
    back = unflatten(vec, schema, extras=m)
    for k in m:
        assert back[k].dtype == m[k].dtype
        assert torch.equal(back[k], m[k])
    with pytest.raises(ValueError, match="tensor 'n' needs a value from extras"):
        unflatten(vec, schema)  # integer buffer needs extras


def test_unsupported_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unsupported dtype torch\.complex64"):
        Schema.of({"z": torch.zeros(2, dtype=torch.complex64)})
