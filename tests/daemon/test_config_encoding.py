"""[fleet] entry_encoding: float32 by default, the codecs of peerd.protocol.encoding, and
every mistake one line (exit 2 from `peerd run`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from peerd.cli.app import app
from peerd.daemon.config import ConfigError, load_config, loads_config
from peerd.protocol.encoding import RAW, Encoding
from tests.daemon.test_config import FLEET, doc, write


def fleet(**keys: object) -> dict[str, object]:
    base = doc()["fleet"]
    assert isinstance(base, dict)
    return {**base, **keys}


def test_the_default_is_float32_the_bytes_of_before() -> None:
    assert loads_config(doc()).fleet.entry_encoding == RAW


@pytest.mark.parametrize("text", ["float32", "float16", "bfloat16", "int8", "int8:256"])
def test_every_encoding_is_read(text: str) -> None:
    encoding = loads_config({"fleet": fleet(entry_encoding=text)}).fleet.entry_encoding
    assert encoding == Encoding.parse(text)
    assert str(encoding) == text


@pytest.mark.parametrize(("value", "message"), [
    ("int4", r"\[fleet\] entry_encoding: unknown entry encoding 'int4': float32, float16, "
             r"bfloat16, int8 or int8:B"),
    ("int8:8", r"\[fleet\] entry_encoding: int8 block 8 outside 16\.\.1048576"),
    ("int8:many", r"int8:B needs an integer B, got 'many'"),
    (16, r"\[fleet\] entry_encoding: must be a string, got 16"),
])
def test_bad_values_are_one_line_errors_naming_the_key(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        loads_config({"fleet": fleet(entry_encoding=value)})
    assert "\n" not in str(info.value)


def test_a_mode_that_publishes_no_weights_refuses_a_compact_encoding() -> None:
    with pytest.raises(ConfigError, match=r"\[fleet\] entry_encoding: float16 applies to "
                                          r"weight entries; \[learning\] mode = \"knowledge\""):
        loads_config({"fleet": fleet(entry_encoding="float16"),
                      "learning": {"mode": "knowledge"}})
    loads_config({"fleet": fleet(entry_encoding="float32"), "learning": {"mode": "knowledge"}})


def test_peerd_run_stops_with_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = write(tmp_path, FLEET + 'entry_encoding = "int3"\n')
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    result = CliRunner().invoke(app, ["run", "--config", str(bad)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"peerd: {err.value}"
    assert "entry_encoding" in result.stderr
