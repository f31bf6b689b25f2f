"""Write a folder of synthetic captures for the example task (no download, deterministic).

    python -m peerd_signals.make_data DIR [--per-class N] [--seed S] [--classes sine,square]

A node that sees only some classes (``--classes``) is the non-IID case the mesh helps with.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from peerd_signals.task import CLASSES, LENGTH


def capture(kind: str, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(LENGTH) / LENGTH
    freq, phase = rng.uniform(2.0, 6.0), rng.uniform(0.0, 2 * np.pi)
    wave = np.sin(2 * np.pi * freq * t + phase)
    if kind == "square":
        wave = np.sign(wave)
    elif kind == "noise":
        wave = rng.normal(0.0, 0.7, LENGTH)
    return wave + rng.normal(0.0, 0.2, LENGTH)


def write(directory: Path, *, per_class: int, seed: int, classes: tuple[str, ...]) -> int:
    """``per_class`` captures of each of ``classes`` under ``directory``; files written."""
    rng = np.random.default_rng(seed)
    for kind in classes:
        folder = directory / kind
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            values = capture(kind, rng)
            (folder / f"{seed:03d}-{i:04d}.txt").write_text(
                "\n".join(f"{v:.6f}" for v in values) + "\n")
    return per_class * len(classes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--per-class", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--classes", default=",".join(CLASSES))
    args = parser.parse_args()
    classes = tuple(c for c in args.classes.split(",") if c)
    unknown = set(classes) - set(CLASSES)
    if unknown:
        parser.error(f"unknown classes {sorted(unknown)}; choose from {', '.join(CLASSES)}")
    n = write(args.directory, per_class=args.per_class, seed=args.seed, classes=classes)
    print(f"wrote {n} captures to {args.directory}")


if __name__ == "__main__":
    main()
