"""benchmarks/bench_rss.py's import probe, the child that measures each import step: it must
print its readings. It ran ``peerd``'s console entry point for the last step, and since that
entry point ends the process itself (``os._exit``, peerd/cli/fastexit.py) the child printed
nothing and the benchmark failed."""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks.bench_rss import IMPORT_STEPS, PARSE_STEP


def test_the_import_probe_prints_a_reading_for_every_step() -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_rss", "--child-imports"],
                         capture_output=True, text=True, check=True, timeout=300)
    rows = json.loads(out.stdout.splitlines()[-1])["rows"]
    steps = [r["step"] for r in rows]
    assert steps[1:] == [label for label, _ in IMPORT_STEPS] + [PARSE_STEP]
    assert all(r["VmHWM"] >= r["VmRSS"] > 0 for r in rows)
    assert rows[-1]["VmHWM"] >= rows[1]["VmHWM"]  # the peak only grows
