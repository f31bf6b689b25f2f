"""`peerd status` in knowledge mode: a kind column and samples; weight mode unchanged. The
mode, blend and local policy come from the status' config, never from the cache's rows."""

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
    config = dataclasses.replace(s.config, mode="knowledge", blend="none",
                                 local_policy="distillation")
    return dataclasses.replace(s, config=config, cache=(row,),
                               entry_bytes={"received/keys": 26_000,
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


def test_the_mode_blend_and_local_policy_are_shown_as_the_status_says() -> None:
    assert "mode weights  blend weighted  local policy plain  task digits" in rendered(
        sample_status())
    assert "mode knowledge  blend none  local policy distillation" in rendered(
        knowledge_status())


def test_an_empty_knowledge_cache_still_gets_its_columns_from_the_mode() -> None:
    # Nothing cached yet: no row could tell the mode, the status' config does.
    text = rendered(dataclasses.replace(knowledge_status(), cache=()))
    assert "samples" in text
    assert " kind " in text


def test_kind_and_entry_bytes_survive_the_json_codec() -> None:
    s = knowledge_status()
    back = from_json(to_json(s))
    assert back == s
    assert back.cache[0].kind == "knowledge"
    assert back.entry_bytes == {"received/keys": 26_000, "received/knowledge": 5_300}


def test_one_local_epoch_is_shown_as_such_not_as_no_steps() -> None:
    # knowledge mode's default local_steps = 0 means one epoch a round (FedCache's rule)
    one_epoch = knowledge_status()
    one_epoch = dataclasses.replace(one_epoch,
                                    config=dataclasses.replace(one_epoch.config, local_steps=0))
    assert "K 1 epoch" in rendered(one_epoch)
    assert "K 10  α" in rendered(sample_status())
