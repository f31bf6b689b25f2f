"""`peerd status` in knowledge mode: a kind column and samples; weight mode unchanged."""

from __future__ import annotations

import dataclasses
import io

from rich.console import Console

from peerd.cli.status import render_status
from peerd.control.status import Status, from_json, to_json
from tests.daemon.helpers import sample_status


def rendered(status: Status) -> str:
    out = io.StringIO()
    render_status(Console(file=out, width=200, color_system=None), status)
    return out.getvalue()


def knowledge_status() -> Status:
    s = sample_status()
    row = dataclasses.replace(s.cache[0], kind="knowledge", examples=203)
    return dataclasses.replace(s, cache=(row,), entry_bytes={"received/keys": 26_000,
                                                             "received/knowledge": 5_300})


def test_knowledge_rows_show_their_kind_and_samples() -> None:
    text = rendered(knowledge_status())
    assert "kind" in text
    assert "samples" in text
    assert "knowledge" in text
    assert "203" in text


def test_weight_rows_render_as_before() -> None:
    text = rendered(sample_status())
    assert "examples" in text
    assert "samples" not in text
    assert " kind " not in text


def test_kind_and_entry_bytes_survive_the_json_codec() -> None:
    s = knowledge_status()
    back = from_json(to_json(s))
    assert back == s
    assert back.cache[0].kind == "knowledge"
    assert back.entry_bytes == {"received/keys": 26_000, "received/knowledge": 5_300}
