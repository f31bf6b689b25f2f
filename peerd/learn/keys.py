"""Sample keys: the fleet-wide encoder that names a private sample without revealing it.

FedCache (seed ``fedcache-notes-zh.txt``, eq. 14) hashes every private sample with a
pretrained network (MobileNetV3 without its last layer) and retrieves, for each local sample,
the samples of other devices whose hashes are most cosine-similar. No pretrained network is
available offline here, so the key is a **seeded random projection** of the normalised input:

    k(x) = P^T u(x) / ‖P^T u(x)‖,   u(x) = (x − mean(x)) / ‖x − mean(x)‖,

with ``P`` a ``[D, key_dim]`` Gaussian matrix. Johnson–Lindenstrauss: inner products of unit
vectors survive a random projection to ``key_dim`` dimensions up to ~``1/sqrt(key_dim)``,
so cosine neighbours in key space are (approximately) cosine neighbours of the centred raw
input. How much retrieval quality that gives up is measured in docs/reproduction.md
(``python -m peerd.learn.keys --dataset fashion-mnist``).

The seed of ``P`` is derived from the fleet id (and the input shape and key size), so every
node of a fleet computes the same keys with no extra configuration and no key material on the
wire; different fleets get unrelated projections. Owns the encoder only: it never sees labels,
logits or the network.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections.abc import Sequence

import numpy as np

#: Domain separation for the projection seed: changing the encoder changes this string.
KEY_DOMAIN = b"peerd-sample-keys-v1"
DEFAULT_KEY_DIM = 64
#: A key of more dimensions than this is a configuration error, not a sample key (and the
#: projection matrix, D x key_dim float32, stays small).
MAX_KEY_DIM = 1024
#: Inputs whose centred norm is below this are constant images: their key is the projection
#: of nothing, so they get the all-zero key (no neighbours are similar to it).
_FLAT_EPS = 1e-12


def projection_seed(fleet_id: bytes, input_shape: tuple[int, ...], key_dim: int) -> int:
    """The 128-bit seed of the projection: sha256(domain ‖ fleet id ‖ shape ‖ key_dim)."""
    shape = ",".join(str(d) for d in input_shape).encode()
    digest = hashlib.sha256(
        KEY_DOMAIN + len(fleet_id).to_bytes(4, "big") + fleet_id + b"|" + shape + b"|"
        + str(key_dim).encode()
    ).digest()
    return int.from_bytes(digest[:16], "big")


class SampleEncoder:
    """``encode(x) -> [n, key_dim]`` float32 unit keys, identical on every node of a fleet."""

    def __init__(
        self, fleet_id: bytes, input_shape: tuple[int, ...], key_dim: int = DEFAULT_KEY_DIM
    ) -> None:
        if not isinstance(fleet_id, bytes | bytearray) or not fleet_id:
            raise ValueError("fleet_id must be non-empty bytes")
        if not input_shape or any(int(d) < 1 for d in input_shape):
            raise ValueError(f"bad input shape {input_shape!r}")
        if not 1 <= key_dim <= MAX_KEY_DIM:
            raise ValueError(f"key_dim must be in 1..{MAX_KEY_DIM}, got {key_dim}")
        self.input_shape = tuple(int(d) for d in input_shape)
        self.key_dim = key_dim
        self.features = math.prod(self.input_shape)
        rng = np.random.default_rng(projection_seed(bytes(fleet_id), self.input_shape, key_dim))
        # Scale is irrelevant (keys are normalised); float32 keeps the matrix small.
        self.projection = rng.standard_normal((self.features, key_dim)).astype(np.float32)

    def encode(self, x: np.ndarray) -> np.ndarray:
        """Keys of the rows of ``x`` (shape ``[n, *input_shape]``)."""
        arr = np.asarray(x)
        if arr.shape[1:] != self.input_shape:
            raise ValueError(f"inputs of shape {arr.shape[1:]}, encoder built for "
                             f"{self.input_shape}")
        if not np.issubdtype(arr.dtype, np.number):
            raise ValueError(f"inputs must be numeric, got {arr.dtype}")
        flat = arr.reshape(arr.shape[0], self.features).astype(np.float32)
        if not np.isfinite(flat).all():
            raise ValueError("inputs contain NaN or infinity")
        return unit_rows(normalise_inputs(flat) @ self.projection)


def normalise_inputs(flat: np.ndarray) -> np.ndarray:
    """Each row centred and scaled to unit norm (brightness and contrast do not matter)."""
    centred = flat - flat.mean(axis=1, keepdims=True)
    return unit_rows(centred)


def unit_rows(m: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    out = np.zeros_like(m, dtype=np.float32)
    ok = norms[:, 0] > _FLAT_EPS
    out[ok] = m[ok] / norms[ok]
    return out


# ------------------------------------------------------------------ retrieval quality


def knn_quality(
    reference: np.ndarray, ref_labels: np.ndarray, queries: np.ndarray, query_labels: np.ndarray,
    *, k: int, exclude_self: bool = False, block: int = 1024,
) -> dict[str, float]:
    """Exact cosine kNN of unit ``queries`` among unit ``reference`` rows.

    Returns the fraction of the k neighbours that share the query's label (label agreement)
    and the accuracy of their majority vote. With ``exclude_self`` the queries are the
    reference rows themselves and each row's best match (itself) is skipped.
    """
    agree = 0
    correct = 0
    classes = int(max(ref_labels.max(), query_labels.max())) + 1
    for lo in range(0, len(queries), block):
        sims = queries[lo : lo + block] @ reference.T
        if exclude_self:
            rows = np.arange(sims.shape[0])
            sims[rows, lo + rows] = -np.inf
        nn = np.argpartition(-sims, k, axis=1)[:, :k]
        labels = ref_labels[nn]
        truth = query_labels[lo : lo + block, None]
        agree += int((labels == truth).sum())
        votes = np.zeros((labels.shape[0], classes), dtype=np.int64)
        np.add.at(votes, (np.arange(labels.shape[0])[:, None], labels), 1)
        correct += int((votes.argmax(axis=1) == truth[:, 0]).sum())
    n = len(queries)
    return {"label_agreement": agree / (n * k), "knn_accuracy": correct / n}


def measure(dataset: str, *, key_dims: Sequence[int], k: int, queries: int,
            fleet_id: bytes) -> dict[str, object]:
    """Retrieval quality of the keys against exact cosine on the raw (and centred) inputs."""
    from peerd.learn.data import load_dataset  # torch only for the measurement command

    data = load_dataset(dataset)
    x_ref = data.x_train.numpy().reshape(len(data.y_train), -1)
    y_ref = data.y_train.numpy()
    x_q = data.x_test.numpy().reshape(len(data.y_test), -1)[:queries]
    y_q = data.y_test.numpy()[:queries]
    rows: dict[str, object] = {
        "raw_cosine": knn_quality(unit_rows(x_ref), y_ref, unit_rows(x_q), y_q, k=k),
        "centred_cosine": knn_quality(normalise_inputs(x_ref), y_ref, normalise_inputs(x_q),
                                      y_q, k=k),
    }
    for d in key_dims:
        enc = SampleEncoder(fleet_id, data.input_shape, d)
        rows[f"keys_{d}"] = knn_quality(enc.encode(data.x_train.numpy()), y_ref,
                                        enc.encode(data.x_test.numpy()[:queries]), y_q, k=k)
    return {"dataset": dataset, "k": k, "queries": len(y_q), "reference": len(y_ref),
            "fleet_id": fleet_id.decode(errors="replace"), "results": rows}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="retrieval quality of peerd's sample keys")
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--key-dims", default="16,64,256")
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--queries", type=int, default=10_000)
    p.add_argument("--fleet-id", default="reproduction")
    args = p.parse_args(argv)
    out = measure(args.dataset, key_dims=[int(d) for d in args.key_dims.split(",")],
                  k=args.k, queries=args.queries, fleet_id=args.fleet_id.encode())
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
