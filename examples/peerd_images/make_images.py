"""Write scikit-learn's handwritten digits as PNG files, one folder per class (no download).

    python -m peerd_images.make_images DIR [--node I --nodes N] [--digits 0,1,2]

``DIR/train/<digit>/*.png`` gets node I's share of the training rows (of N nodes), and
``DIR/val/<digit>/*.png`` the held-out rows (the same for every node). ``--digits`` keeps only
those classes in ``train/``: a node that never sees some digits is the non-IID case a mesh
helps with.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

#: Rows of the 1,797 held out for validation (a fixed, seeded split).
VAL_ROWS = 360


def write(directory: Path, *, node: int = 0, nodes: int = 1,
          digits: tuple[int, ...] = tuple(range(10))) -> tuple[int, int]:
    """Write node ``node``'s images under ``directory``; (training, validation) files written."""
    if not 0 <= node < nodes:
        raise ValueError(f"node {node} not in [0, {nodes})")
    ds = load_digits()
    order = np.random.default_rng(0).permutation(len(ds.target))
    val, train = order[:VAL_ROWS], order[VAL_ROWS:]
    mine = train[node::nodes]  # every node its own rows
    counts = [0, 0]
    for split, rows in ((0, mine), (1, val)):
        for row in rows:
            label = int(ds.target[row])
            if split == 0 and label not in digits:
                continue
            folder = directory / ("train", "val")[split] / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            # 0..16 grey levels scaled to 8-bit, as a scanner would store them.
            pixels = (ds.images[row] * (255 / 16)).round().astype(np.uint8)
            Image.fromarray(pixels, mode="L").save(folder / f"{row:04d}.png")
            counts[split] += 1
    return counts[0], counts[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--node", type=int, default=0)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--digits", default="0,1,2,3,4,5,6,7,8,9")
    args = parser.parse_args()
    digits = tuple(int(d) for d in args.digits.split(",") if d)
    n_train, n_val = write(args.directory, node=args.node, nodes=args.nodes, digits=digits)
    print(f"{args.directory}: {n_train} training and {n_val} validation images")


if __name__ == "__main__":
    main()
