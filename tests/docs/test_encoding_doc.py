"""docs/benchmarks.md's compact-encoding section is what benchmarks.bench_encoding renders from
the committed runs (docs/results/encoding/): a number edited by hand, or outputs replaced
without re-rendering, fails here; so does a run whose file lacks its provenance."""

from __future__ import annotations

import json
import statistics

from benchmarks import bench_encoding as be
from benchmarks._report import read_section


def test_the_section_is_rendered_from_the_committed_runs() -> None:
    assert read_section(be.SECTION) == be.table().rstrip()


def test_every_committed_run_names_its_command_commit_machine_and_date() -> None:
    paths = sorted(be.RESULTS.rglob("*.json"))
    assert len(paths) >= 2 * len(be.SEEDS)  # at least float32 and one codec on digits
    for path in paths:
        doc = json.loads(path.read_text())
        dataset = path.parent.name
        encoding, seed = path.stem.rsplit("-s", 1)
        encoding = encoding.replace("int8-", "int8:")
        assert doc["command"] == " ".join(be.command(dataset, encoding, int(seed)))
        assert doc["commit"]
        assert "+dirty" not in doc["commit"]
        assert doc["machine"]
        assert doc["date"]
        assert doc["summary"]["config"]["entry_encoding"] == encoding


def test_a_cell_recomputed_by_hand() -> None:
    runs = [json.loads(be.result_path("digits", "float16", s).read_text()) for s in be.SEEDS]
    accs = [100 * r["summary"]["results"]["cached-dfl"]["final_accuracy_mean"] for r in runs]
    row = next(r for r in read_section(be.SECTION).splitlines()
               if r.startswith("| digits | float16 |"))
    assert row.split("|")[3].strip() == (f"{statistics.fmean(accs):.1f} ± "
                                         f"{statistics.stdev(accs):.1f}")
    # float16 halves every entry: the payload is 2 bytes a value.
    params = runs[0]["parameters"]
    assert runs[0]["exchange"]["payload_bytes"] == [2 * params]
