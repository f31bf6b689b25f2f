"""What in docs/*.md is *not* rendered: the marked blocks, and number tables outside them.

:mod:`benchmarks.docs_tables` renders and diffs the registered blocks; this module finds what
would slip past that: a marked block nobody registered (:func:`marked_blocks`), and a
Markdown table with numbers outside every marked block (:func:`unmarked_numeric_tables`),
which must be reference (:data:`REFERENCE`: defaults, limits, fields) or listed debt
(:data:`UNCOVERED`). Apart from the registry because it reads only the docs' text, never an
output or a renderer.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

#: Unmarked sections with *measured* numbers in a table, copied into the doc by hand or by a
#: script's printout (issue 28's debt). ``(doc, heading)``: the nearest heading above.
UNCOVERED: frozenset[tuple[str, str]] = frozenset({
})

#: Unmarked tables whose numbers are reference, not measurement (config defaults, limits,
#: protocol fields, what a test or fault does): nothing to render.
REFERENCE: frozenset[tuple[str, str]] = frozenset({
    ("docs/integration.md", "The harness"), ("docs/integration.md", "Scenarios"),
    ("docs/learners.md", "What is refused"),
    ("docs/operations.md", "`[node]`"), ("docs/operations.md", "`[network]`"),
    ("docs/operations.md", "`[learning]`"), ("docs/operations.md", "`[learning.knowledge]`"),
    ("docs/operations.md", "`[learning.cordial]`"), ("docs/operations.md", "`[learning.fedbss]`"),
    ("docs/operations.md", "`[validation]`"), ("docs/operations.md", "`[task]`"),
    ("docs/operations.md", "Taking the model out: `peerd export`"),
    ("docs/protocol.md", "Fleet membership"), ("docs/protocol.md", "Messages"),
    ("docs/protocol.md", "Entry body (msgpack map inside `body`)"),
    ("docs/protocol.md", "Admission (`admit_entry`)"),
    ("docs/protocol.md", "Typed entries: knowledge and keys (FedCache without a server)"),
    ("docs/protocol.md", "Address records"),
    ("docs/protocol.md", "Compact encodings (`[fleet] entry_encoding`, issue 27)"),
    ("docs/operations.md", "`[fleet]`"),
    ("docs/reliability.md", "What runs"), ("docs/robustness.md", "What ran"),
    ("docs/transport.md", "py-libp2p 0.8.1 defects, and how `transport.py` handles them"),
    ("docs/transport.md", "Slow, lossy links in the namespace WAN"),  # what wan.py configures
})


MARKED = re.compile(r"<!-- (bench:([a-z0-9-]+)|reproduce:table ([a-z0-9-]+)|"
                    r"robustness-table:start) -->")


def marked_blocks(doc: Path) -> list[str]:
    """The names of the blocks ``doc`` marks (any kind)."""
    out = []
    for m in MARKED.finditer(doc.read_text()):
        out.append(m.group(2) or m.group(3) or "robustness-table")
    return out


def _spans(text: str) -> list[tuple[int, int]]:
    """Character spans of every marked block of ``text`` (markers included)."""
    spans = []
    for m in MARKED.finditer(text):
        if m.group(2):
            end = text.find(f"<!-- /bench:{m.group(2)} -->", m.end())
        elif m.group(3):
            end = text.find("<!-- /reproduce -->", m.end())
        else:
            end = text.find("<!-- robustness-table:end -->", m.end())
        spans.append((m.start(), len(text) if end < 0 else end))
    return spans


NUMBER = re.compile(r"\d+\.\d+|\d+(?:,\d{3})+|\b\d{2,}\b")


def unmarked_numeric_tables(doc: Path) -> Iterator[tuple[str, str]]:
    """``(heading, row)`` for every Markdown table row with a number outside every marked
    block of ``doc`` (fenced code is skipped: commands and config, not results)."""
    text = doc.read_text()
    spans = _spans(text)
    heading, pos, fenced = "(top)", 0, False
    for line in text.splitlines(keepends=True):
        start, pos = pos, pos + len(line)
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.startswith("#"):
            heading = stripped.lstrip("#").strip()
            continue
        if not stripped.startswith("|") or re.fullmatch(r"[|\s:-]+", stripped):
            continue
        if any(a <= start < b for a, b in spans):
            continue
        if NUMBER.search(stripped):
            yield heading, stripped
