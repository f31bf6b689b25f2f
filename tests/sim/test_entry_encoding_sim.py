"""`peerd sim --entry-encoding`: cached-DFL's peers blend the entries as decoded from the
wire's codec, each agent its own float32 model, and the bytes the exchanges move are the
encoded payloads'."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.core.entry import Schema
from peerd.core.round import blend_step
from peerd.protocol.encoding import Encoding
from peerd.sim.algorithms import CachedDFL, Contacts
from peerd.sim.output import summary_json
from peerd.sim.runner import run
from peerd.sim.wirecodec import WireCodec
from tests.sim.test_algorithms import UNIFORM, _pairs
from tests.sim.test_runner import TINY

SCHEMA = Schema.of({"a": torch.zeros(40), "b": torch.zeros(2, 20)})  # 80 float32 values


def test_peers_blend_the_decoded_entry_the_agent_its_own_model() -> None:
    wire = WireCodec(SCHEMA, Encoding("int8", 0))
    fleet = CachedDFL(torch.zeros(2, 80), [1, 1], capacity=3, tau_max=5, policy=UNIFORM,
                      wire=wire)
    trained = torch.linspace(-1, 1, 160, dtype=torch.float32).reshape(2, 80)
    met = np.array([[False, True], [True, False]])
    fleet.publish(trained, 0, Contacts([_pairs((0, 1))], met))
    blend_step(fleet.agents(), clock=fleet.clock, policy=fleet.policy, ops=fleet)
    decoded, sizes = wire.roundtrip(trained)
    assert not torch.equal(decoded, trained)
    assert sizes == [2 * 4 + 80] * 2  # a scale per tensor, a byte per value
    # Agent 0: half its own float32 model, half agent 1's entry as received.
    assert torch.allclose(fleet.matrix[0], (trained[0] + decoded[1]) / 2)
    assert torch.allclose(fleet.matrix[1], (trained[1] + decoded[0]) / 2)
    assert fleet.transfers == [2]
    assert fleet.transfer_bytes == [2 * 88]


def test_without_an_encoding_the_bank_holds_the_trained_rows() -> None:
    fleet = CachedDFL(torch.zeros(2, 80), [1, 1], capacity=3, tau_max=5, policy=UNIFORM)
    trained = torch.linspace(-1, 1, 160, dtype=torch.float32).reshape(2, 80)
    met = np.array([[False, True], [True, False]])
    fleet.publish(trained, 0, Contacts([_pairs((0, 1))], met))
    blend_step(fleet.agents(), clock=fleet.clock, policy=fleet.policy, ops=fleet)
    assert torch.equal(fleet.matrix[0], (trained[0] + trained[1]) / 2)
    assert fleet.transfer_bytes == [2 * 80 * 4]


CACHED = replace(TINY, algorithms=("cached-dfl", "isolated"))


def test_bytes_per_round_follow_the_payload_and_the_merges_do_not_change() -> None:
    runs = {e: run(replace(CACHED, entry_encoding=e)) for e in ("float32", "float16", "int8:256")}
    ex = {e: r.info["exchange"] for e, r in runs.items()}
    params = runs["float32"].info["parameters"]
    assert ex["float32"]["payload_bytes"] == [4 * params]
    assert ex["float16"]["payload_bytes"] == [2 * params]
    # Which entries move depends on metadata only: the same transfers under every encoding.
    assert ex["float16"]["transfers"] == ex["float32"]["transfers"] == ex["int8:256"]["transfers"]
    assert sum(ex["float32"]["transfers"]) > 0
    assert [2 * b for b in ex["float16"]["bytes"]] == ex["float32"]["bytes"]
    summary = {e: summary_json(r)["results"] for e, r in runs.items()}
    assert summary["float32"]["cached-dfl"]["bytes_per_round"] == pytest.approx(
        2 * summary["float16"]["cached-dfl"]["bytes_per_round"])
    assert summary["float32"]["cached-dfl"]["bytes_per_round"] > \
        3.5 * summary["int8:256"]["cached-dfl"]["bytes_per_round"]
    assert summary["float32"]["isolated"]["bytes_per_round"] is None
    # The encoding reaches the models: cached-DFL's curve moves, isolated's does not.
    assert summary["int8:256"]["cached-dfl"]["drift_curve"] != \
        summary["float32"]["cached-dfl"]["drift_curve"]
    assert summary["int8:256"]["isolated"] == summary["float32"]["isolated"]
    assert summary_json(runs["float16"])["config"]["entry_encoding"] == "float16"


def test_an_encoding_with_algorithms_that_blend_float32_is_refused() -> None:
    with pytest.raises(ValueError, match="entry-encoding applies to cached-dfl"):
        replace(TINY, entry_encoding="float16").validate()
    with pytest.raises(ValueError, match="unknown entry encoding"):
        replace(CACHED, entry_encoding="int4").validate()


@pytest.mark.parametrize("args", [["--entry-encoding", "int4"],
                                  ["--entry-encoding", "int8", "--algorithms", "dfl"],
                                  ["--entry-encoding", "int8", "--algorithms", "fedcache"]])
def test_the_cli_refuses_bad_encodings_with_exit_2(args: list[str]) -> None:
    result = CliRunner().invoke(app, ["sim", "--agents", "2", "--rounds", "1", *args])
    assert result.exit_code == 2, result.output
    assert "error" in result.stderr
