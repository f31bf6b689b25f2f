"""Which committed outputs behind the docs' rendered tables name the run that made them.

Issue 28 item 2: every output names its commit and its full command. An output written with
:mod:`benchmarks._provenance` carries a ``provenance`` record; a few older tools recorded
their command (and machine) as ``command``. The outputs measured before either are listed in
:data:`NO_PROVENANCE` (the known debt, by path pattern); ``tests/docs/test_docs_provenance.py``
fails on any other output without one, and on a pattern that no longer matches such an
output (so the list only shrinks).
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable
from pathlib import Path

from benchmarks.docs_tables import ROOT, DocTable

#: Outputs measured before their tool recorded its provenance; each needs a re-run.
NO_PROVENANCE: frozenset[str] = frozenset({
    "docs/reliability/soak-30min-*.json",  # the kept older runs (soak-30min.json has one)
    "docs/reliability/soak-targeted-*.json",
})


def source_files(tables: Iterable[DocTable]) -> set[str]:
    """Every file a registered table names as its source (globs expanded; the reproduction
    tables, whose sources are folders, have their own check in tests/docs)."""
    out: set[str] = set()
    for table in tables:
        for source in table.sources.split(", "):
            if source.endswith("/"):
                continue
            out |= {str(p.relative_to(ROOT)) for p in ROOT.glob(source) if p.is_file()}
    return out


def names_its_run(path: Path) -> bool:
    if path.suffix != ".json":
        return False
    data = json.loads(path.read_text())
    return isinstance(data, dict) and ("provenance" in data or "command" in data)


def without_provenance(tables: Iterable[DocTable]) -> set[str]:
    return {rel for rel in source_files(tables) if not names_its_run(ROOT / rel)}


def known(rel: str) -> bool:
    return any(fnmatch.fnmatch(rel, pattern) for pattern in NO_PROVENANCE)


def by_pattern(tables: Iterable[DocTable]) -> dict[str, int]:
    """How many outputs without provenance each known pattern covers ("UNLISTED": none)."""
    out: dict[str, int] = {}
    for rel in sorted(without_provenance(tables)):
        key = next((p for p in sorted(NO_PROVENANCE) if fnmatch.fnmatch(rel, p)),
                   f"{rel} (UNLISTED)")
        out[key] = out.get(key, 0) + 1
    return out
