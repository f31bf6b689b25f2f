"""Every committed output behind a rendered table of docs/ names its commit and command, but
the known debt of benchmarks.docs_provenance.NO_PROVENANCE, which may only shrink."""

from __future__ import annotations

import fnmatch

from benchmarks import docs_provenance as dp
from benchmarks import docs_tables as dt

TABLES = dt.registry()


def test_every_output_names_the_run_that_made_it() -> None:
    missing = {rel for rel in dp.without_provenance(TABLES) if not dp.known(rel)}
    assert not missing, f"outputs with no provenance record (re-run with --json): {missing}"


def test_the_known_debt_is_still_debt() -> None:
    missing = dp.without_provenance(TABLES)
    stale = {p for p in dp.NO_PROVENANCE if not any(fnmatch.fnmatch(m, p) for m in missing)}
    assert not stale, f"every output these match has provenance now (remove them): {stale}"


def test_a_new_output_without_provenance_is_caught() -> None:
    assert not dp.known("docs/reproduction/new-benchmark.json")
    assert dp.known("docs/reliability/soak-30min-533bb07.json")  # by its pattern
    assert not dp.known("docs/robustness/alie-10-krum-s0.json")  # re-run with provenance
