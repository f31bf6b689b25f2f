"""Shared helpers for benchmarks: machine facts and a sectioned docs/benchmarks.md.

Each benchmark owns one section between ``<!-- bench:NAME -->`` markers, so running one
benchmark rewrites only its own numbers and keeps the others'.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import _provenance

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = """# Benchmarks

Every number below comes from running the command in its section on the machine it names.
Sections with committed readings are re-rendered from them and diffed by
`tests/docs/test_docs_tables.py` (`python -m benchmarks.docs_tables --uncovered` lists the
ones still written straight into this file).
Speed targets are judged as ratios against a baseline measured in the same run (same process,
interleaved repetitions, median), so machine load affects both sides alike.
"""


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"{datetime.now(UTC):%Y-%m-%d}"
    )


def commit(paths: tuple[str, ...] = ("peerd", "protocol", "cli")) -> str:
    """HEAD's short hash, "+dirty" when ``paths`` have changes not committed."""
    root = DOC.parent.parent
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", *paths],
                           capture_output=True, text=True, check=True).stdout.strip()
    return head + ("+dirty" if dirty else "")


def median_time(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved(fns: dict[str, Callable[[], object]], repeat: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call for each fn, alternating between them every repetition."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def write_section(name: str, markdown: str, doc: Path = DOC) -> None:
    text = doc.read_text() if doc.exists() else HEADER
    block = f"<!-- bench:{name} -->\n{markdown.rstrip()}\n<!-- /bench:{name} -->"
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


def readings_parser(description: str | None) -> argparse.ArgumentParser:
    """The options of a benchmark that renders its section from committed readings."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument("--no-write", action="store_true",
                    help="print only: leave docs/benchmarks.md and the readings alone")
    ap.add_argument("--render", action="store_true",
                    help="measure nothing: rewrite the section from the committed readings")
    return ap


def run_section(name: str, parser: argparse.ArgumentParser, args: argparse.Namespace,
                readings: Path, measure: Callable[[], dict[str, Any]],
                render: Callable[[dict[str, Any]], str], doc: Path = DOC) -> None:
    """``--render``: the section of ``doc`` from ``readings``; else measure, record the
    provenance with the readings, print the section and (unless ``--no-write``) store both."""
    if args.render:
        write_section(name, render(json.loads(readings.read_text())), doc)
        return
    started = _provenance.start(parser, args)
    r = measure()
    r["provenance"] = started.record()
    md = render(r)
    print(md)
    if not args.no_write:
        readings.write_text(json.dumps(r, indent=1) + "\n")
        write_section(name, md, doc)


def read_section(name: str, doc: Path = DOC) -> str:
    """What :func:`write_section` put between ``name``'s markers in ``doc``."""
    text = doc.read_text()
    return text.split(f"<!-- bench:{name} -->\n")[1].split(f"\n<!-- /bench:{name} -->")[0]
