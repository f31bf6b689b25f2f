"""Entry encode+sign and verify+decode throughput against hashlib.sha256 on the same bytes.

    .venv/bin/python -m benchmarks.bench_protocol [--params N] [--repeat N] [--quick]
        [--no-write] [--render]

The readings (with their provenance) go to docs/reproduction/protocol.json and the section
of docs/benchmarks.md is rendered from them (``--render`` re-renders without measuring;
benchmarks/docs_tables.py and tests/docs re-render and diff it).

Hashing the payload is the floor (the signature covers its SHA-256), so the goal is that
everything else together costs no more than the hash: ratio >= 0.5 of sha256's GB/s.
"receive" includes the FrameDecoder copying 64 KiB socket-sized chunks into the frame buffer.
"""

from __future__ import annotations

import hashlib
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from peerd.protocol.admission import admit_entry, entry_frame_limit
from peerd.protocol.entry import sign_entry
from peerd.protocol.frames import FrameDecoder
from peerd.protocol.identity import private_key_from_seed, public_key_bytes
from peerd.protocol.ledger import OriginLedger
from peerd.protocol.manifest import Manifest
from peerd.protocol.messages import Entry, decode_frame

FLEET = bytes(16)
FLOOR = "hashlib.sha256 (floor)"
CHUNK = 64 * 1024


def model(params: int) -> dict[str, np.ndarray[Any, Any]]:
    """A ResNet-ish split of ``params`` float32 values into a few dozen tensors."""
    rng = np.random.default_rng(0)
    sizes = [params // 20] * 19
    sizes.append(params - sum(sizes))
    return {
        f"layer{i:02d}.weight": rng.standard_normal(n, dtype=np.float32)
        for i, n in enumerate(sizes)
    }


def timed(ops: list[tuple[str, Callable[[], object]]], repeat: int) -> list[tuple[str, float]]:
    """Median time of each op, interleaving ops round by round (after one warm-up call) so
    that a burst of load from other processes hits all of them alike."""
    samples: dict[str, list[float]] = {name: [] for name, _ in ops}
    for _, fn in ops:
        fn()
    for _ in range(repeat):
        for name, fn in ops:
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return [(name, statistics.median(samples[name])) for name, _ in ops]


#: The committed readings the doc's section is rendered from (docs_tables re-renders it).
READINGS = Path(__file__).resolve().parent.parent / "docs" / "reproduction" / "protocol.json"


def measure(params: int, repeat: int) -> dict[str, Any]:
    """Every reading of the section, JSON-able."""
    key = private_key_from_seed(bytes(32))
    tensors = model(params)
    schema = {name: ("float32", tuple(a.shape)) for name, a in tensors.items()}
    manifest = Manifest(FLEET, 1).admit(public_key_bytes(key), None)

    def encode() -> list[bytes | memoryview]:
        return sign_entry(
            key,
            FLEET,
            version=1,
            created_at=0.0,
            schema_id="00" * 32,
            num_examples=1,
            tensors=tensors,
        ).to_wire_parts()

    parts = encode()
    wire = b"".join(parts)
    payload = memoryview(wire)[len(wire) - sum(len(p) for p in parts[2:]) :]
    nbytes = len(payload)

    def receive() -> object:
        dec = FrameDecoder(entry_frame_limit(schema))
        frames = []
        view = memoryview(wire)
        for i in range(0, len(view), CHUNK):
            frames += dec.feed(view[i : i + CHUNK])
        return verify(frames[0])

    def verify(frame: bytearray | bytes | memoryview) -> object:
        msg = decode_frame(frame)
        assert isinstance(msg, Entry)
        return admit_entry(
            msg, fleet_id=FLEET, manifest=manifest, ledger=OriginLedger(), schema=schema, now=0.0
        )

    frame_only = bytearray(wire[4:])
    rows = timed(
        [
            (FLOOR, lambda: hashlib.sha256(payload).digest()),
            ("encode + sign", encode),
            ("verify + decode (frame in memory)", lambda: verify(frame_only)),
            ("receive 64 KiB chunks + verify + decode", receive),
        ],
        repeat,
    )
    return {"params": params, "repeat": repeat, "payload_bytes": nbytes,
            "overhead_bytes": len(wire) - nbytes, "median_s": dict(rows),
            "python": platform.python_version(), "arch": platform.machine()}


def render(r: dict[str, Any]) -> str:
    """The doc's section from one run's readings."""
    nbytes, times = r["payload_bytes"], r["median_s"]
    sha = times[FLOOR]
    lines = [
        "## Protocol (`peerd.protocol`) — `python -m benchmarks.bench_protocol`",
        "",
        f"Entry of {r['params']:,} float32 parameters ({nbytes / 1e6:.1f} MB payload, "
        f"{r['overhead_bytes']} B framing+envelope); median of {r['repeat']} interleaved runs; "
        f"Python {r['python']}, {r['arch']}.",
        "",
        "| operation | time (ms) | GB/s | vs sha256 |",
        "|---|---:|---:|---:|",
    ]
    for name, t in times.items():
        lines.append(f"| {name} | {t * 1e3:.1f} | {nbytes / t / 1e9:.2f} | {sha / t:.2f}x |")
    if "provenance" in r:
        from benchmarks import _provenance  # needs `python -m` from the repo root

        lines += ["", _provenance.line(r["provenance"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    from benchmarks._report import readings_parser, run_section  # `python -m` from the root

    parser = readings_parser(__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=11_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    params, repeat = (1_100_000, 5) if args.quick else (args.params, args.repeat)
    run_section("protocol", parser, args, READINGS, lambda: measure(params, repeat), render)


if __name__ == "__main__":
    main()
