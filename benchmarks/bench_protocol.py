"""Entry encode+sign and verify+decode throughput against hashlib.sha256 on the same bytes.

    .venv/bin/python -m benchmarks.bench_protocol [--params N] [--repeat N] [--out FILE] [--doc]

``--doc`` rewrites this benchmark's section of docs/benchmarks.md (via benchmarks._report).

Hashing the payload is the floor (the signature covers its SHA-256), so the goal is that
everything else together costs no more than the hash: ratio >= 0.5 of sha256's GB/s.
"receive" includes the FrameDecoder copying 64 KiB socket-sized chunks into the frame buffer.
"""

from __future__ import annotations

import argparse
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


def run(params: int, repeat: int) -> str:
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
            ("hashlib.sha256 (floor)", lambda: hashlib.sha256(payload).digest()),
            ("encode + sign", encode),
            ("verify + decode (frame in memory)", lambda: verify(frame_only)),
            ("receive 64 KiB chunks + verify + decode", receive),
        ],
        repeat,
    )
    sha = rows[0][1]
    lines = [
        f"Entry of {params:,} float32 parameters ({nbytes / 1e6:.1f} MB payload, "
        f"{len(wire) - nbytes} B framing+envelope); median of {repeat} interleaved runs; "
        f"Python {platform.python_version()}, {platform.machine()}.",
        "",
        "| operation | time (ms) | GB/s | vs sha256 |",
        "|---|---:|---:|---:|",
    ]
    for name, t in rows:
        lines.append(f"| {name} | {t * 1e3:.1f} | {nbytes / t / 1e9:.2f} | {sha / t:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=11_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    parser.add_argument("--doc", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    from benchmarks import _provenance  # needs `python -m` from the repo root

    started = _provenance.start(parser, args)
    table = run(args.params, args.repeat)
    print(table, end="")
    if args.out:
        args.out.write_text(table)
    if args.doc:
        from benchmarks._report import write_section  # needs `python -m` from the repo root

        write_section(
            "protocol",
            "## Protocol (`peerd.protocol`) — `python -m benchmarks.bench_protocol`\n\n" + table
            + "\n" + _provenance.line(started.record()) + "\n",
        )


if __name__ == "__main__":
    main()
