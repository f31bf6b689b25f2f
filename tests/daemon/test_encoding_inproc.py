"""[fleet] entry_encoding on real ``Daemon`` objects in one process (tests/daemon/inprocfleet.py):
an int8 node and a float32 node exchange entries; each publishes in its own encoding, each
caches the other's as float32, the int8 node's state file holds the encoded bytes, and its
own model stays float32 (only what it sends is rounded)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from rich.console import Console

from peerd.cli.status import status_view
from peerd.node.decoded import DecodedParams
from peerd.protocol.encoding import Encoding
from peerd.protocol.entry import EntryBody
from tests.daemon.inprocfleet import Fleet, fleet_configs


def test_an_int8_node_and_a_float32_node_learn_from_each_other(tmp_path: Path) -> None:
    cfgs = fleet_configs(tmp_path, 2, learning={"local_steps": 3})
    int8 = dataclasses.replace(cfgs[0], fleet=dataclasses.replace(
        cfgs[0].fleet, entry_encoding=Encoding("int8", 256)))
    fleet = Fleet([int8, cfgs[1]])
    a, b = fleet[0], fleet[1]
    assert (str(a.node.encoding), str(b.node.encoding)) == ("int8:256", "float32")
    for _ in range(2):
        fleet.cycle()
    assert a.node.own is not None
    assert b.node.own is not None
    codecs = {i.codec for i in EntryBody.from_bytes(a.node.own.message.envelope.body).tensors}
    assert "int8" in codecs
    assert {i.codec for i in EntryBody.from_bytes(
        b.node.own.message.envelope.body).tensors} == {None}
    # Each caches the other's newest entry, as float32 tensors of the local schema.
    [held_by_b] = b.node.blend_inputs()
    [held_by_a] = a.node.blend_inputs()
    assert held_by_b.meta.origin == a.node.id
    assert held_by_a.meta.origin == b.node.id
    for entry in (held_by_a, held_by_b):
        for spec in b.node.schema.float_specs:
            assert entry.params[spec.name].dtype == torch.float32
    # Mapped from its state file and decoded when read: no float32 copy held between rounds.
    assert isinstance(held_by_b.params, DecodedParams)
    assert not isinstance(held_by_a.params, DecodedParams)  # raw: the file's own views
    # What b holds of a is a's own entry, decoded: equal to a's own entry's tensors.
    for name, t in a.node.own.entry.params.items():
        assert torch.equal(held_by_b.params[name], t)
    # The int8 node's entry is smaller than the float32 one's by about 4x.
    assert len(a.node.own.message.payload) * 3.5 < len(b.node.own.message.payload)
    # Its model is not its rounded entry: it kept training in float32.
    assert not a.mode.model_is_published  # type: ignore[attr-defined]
    assert b.mode.model_is_published  # type: ignore[attr-defined]


def test_a_restarted_node_restores_encoded_entries_from_its_state_files(tmp_path: Path) -> None:
    cfgs = fleet_configs(tmp_path, 2, learning={"local_steps": 3})
    half = dataclasses.replace(cfgs[0], fleet=dataclasses.replace(
        cfgs[0].fleet, entry_encoding=Encoding.parse("float16")))
    fleet = Fleet([half, cfgs[1]])
    fleet.cycle()
    [before] = fleet[1].node.blend_inputs()
    want = {name: before.params[name].clone() for name in before.params}
    b = fleet.restart(1)
    [after] = b.node.blend_inputs()
    assert after.meta == before.meta
    assert isinstance(after.params, DecodedParams)
    for name, t in want.items():
        assert torch.equal(after.params[name], t)
    a = fleet.restart(0)  # its own entry, restored: the model is the entry's decoding
    assert a.node.own is not None
    assert a.node.own.entry.meta.digest == fleet[1].node.blend_inputs()[0].meta.digest


def test_the_status_shows_each_entry_as_its_origin_encoded_it(tmp_path: Path) -> None:
    cfgs = fleet_configs(tmp_path, 2, learning={"local_steps": 3})
    int8 = dataclasses.replace(cfgs[0], fleet=dataclasses.replace(
        cfgs[0].fleet, entry_encoding=Encoding("int8", 256)))
    fleet = Fleet([int8, cfgs[1]])
    for _ in range(2):
        fleet.cycle()
    a, b = fleet[0].status(), fleet[1].status()
    assert (a.config.encoding, b.config.encoding) == ("int8:256", "float32")
    [row_at_b] = b.cache
    [row_at_a] = a.cache
    assert (row_at_b.origin, row_at_b.encoding) == (fleet[0].node.id, "int8:256")
    assert (row_at_a.origin, row_at_a.encoding) == (fleet[1].node.id, "float32")
    # The human view: the settings line names a compact encoding, the cache an encoding
    # column once an entry is not float32.
    console = Console(width=200, record=True)
    console.print(status_view(b))
    text = console.export_text()
    assert "entries int8" not in text
    assert "encoding" in text
    assert "int8:256" in text
    console = Console(width=200, record=True)
    console.print(status_view(a))
    text = console.export_text()
    assert "entries int8:256" in text
    assert "encoding" not in text
