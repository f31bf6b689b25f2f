"""Every registered table of docs/*.md (benchmarks.docs_tables) is what its renderer makes of
the committed outputs: a number copied or edited by hand fails here, and so does an output
replaced without re-rendering. Every marked block is registered or on the known-debt list, and
a number-bearing table outside every block must be listed (debt or reference), so a new table
copied by hand into a doc fails too (issue 28)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import docs_scan as scan
from benchmarks import docs_tables as dt

TABLES = dt.registry()


@pytest.mark.parametrize("table", TABLES, ids=[t.key for t in TABLES])
def test_every_registered_table_is_its_committed_output_rendered(table: dt.DocTable) -> None:
    assert table.diff() == "", f"{table.key} is not what {table.sources} renders"


def test_a_number_edited_by_hand_is_caught() -> None:
    # One digit changed in each registered table's block: every check must see it.
    for table in TABLES:
        text = table.doc.read_text()
        block = table.block(text)
        digit = re.search(r"\d", table.rendered())
        if digit is None:  # a "not run yet" note: no numbers to tamper with
            continue
        at = block.index(table.rendered()) + digit.start() if not table.exact else \
            digit.start()
        tampered_block = block[:at] + ("7" if block[at] != "7" else "8") + block[at + 1:]
        tampered = text.replace(block, tampered_block, 1)
        assert table.diff(tampered) != "", f"{table.key}: an edited digit went unnoticed"


def test_every_marked_block_is_registered_or_known_debt() -> None:
    registered = {(str(t.doc.relative_to(dt.ROOT)), t.name) for t in TABLES}
    assert len(registered) == len(TABLES), "a block is registered twice"
    marked = {(str(doc.relative_to(dt.ROOT)), name)
              for doc in dt.DOCS.glob("*.md") for name in scan.marked_blocks(doc)}
    assert registered <= marked, f"registered but not in the docs: {registered - marked}"
    assert marked - registered == dt.unregistered()


def test_every_numeric_table_outside_the_blocks_is_listed() -> None:
    found = {(str(doc.relative_to(dt.ROOT)), heading)
             for doc in dt.DOCS.glob("*.md")
             for heading, _ in scan.unmarked_numeric_tables(doc)}
    unlisted = found - scan.UNCOVERED - scan.REFERENCE
    assert not unlisted, f"tables with numbers no renderer covers: {sorted(unlisted)}"
    stale = (scan.UNCOVERED | scan.REFERENCE) - found
    assert not stale, f"listed but no longer there (remove them): {sorted(stale)}"


def test_a_table_copied_by_hand_into_a_doc_is_found(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("# Results\n\n| run | accuracy |\n| --- | --- |\n| a | 0.93 |\n\n"
                   "<!-- bench:y -->\n| b | 0.91 |\n<!-- /bench:y -->\n\n```\n| c | 0.5 |\n```\n")
    assert list(scan.unmarked_numeric_tables(doc)) == [("Results", "| a | 0.93 |")]


def test_write_puts_the_rendering_between_the_markers_and_keeps_the_rest(
        tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text("intro\n<!-- bench:x -->\n| a | 0.5 |\n<!-- /bench:x -->\n\n"
                   "<!-- bench:y -->\n| b | 2.0 |\n<!-- /bench:y -->\nend\n")
    table = dt.DocTable(doc, "bench", "x", "nowhere", lambda: "| a | 0.75 |\n")
    assert table.diff() != ""
    dt.write(table)
    assert doc.read_text() == ("intro\n<!-- bench:x -->\n| a | 0.75 |\n<!-- /bench:x -->\n\n"
                               "<!-- bench:y -->\n| b | 2.0 |\n<!-- /bench:y -->\nend\n")
    assert table.diff() == ""
