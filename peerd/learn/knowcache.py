"""The node's knowledge cache: other origins' per-sample logits, found by sample key.

FedCache (seed ``fedcache-notes-zh.txt`` §4.2) keeps, per label, the keys ("hashes") of every
sample and the latest logits of each; for a local sample it returns the mean logits of the R
samples of the same label whose keys are most cosine-similar (eq. 10–12, 17). peerd has no
server: each node holds its own cache, filled by gossip with :class:`KnowledgeBatch` es (one
per origin: a batch of that origin's samples) and queried with its own samples' keys.

**Index.** Per label one approximate-nearest-neighbour index over the unit keys of that
label, inner product (= cosine). The library is faiss (``faiss-cpu``, pinned): a maintained
binary wheel (no compiler at install, unlike hnswlib's sdist here), its ``IndexHNSWFlat`` is
the paper's HNSW, and it offers an exact ``IndexFlatIP`` behind the same API, which small
labels use (below :data:`HNSW_MIN` keys a graph costs more to build than a brute-force scan
of a few thousand 64-d keys, and exact is exact). usearch would allow removals in place but
marks them lazily and its recall after many removals is the library's business; pynndescent
builds in numba (seconds of JIT per process).

**Rebuild, not incremental update.** An origin's keys are sent once and then only its logits
change (the paper's initialisation / training split). So :meth:`KnowledgeCache.put` of a batch
whose keys and labels equal the origin's previous ones only replaces logits: no index is
touched. A batch with new keys, or :meth:`drop` (expiry, capacity), marks the labels it
touches dirty, and a dirty label's index is rebuilt on the next query. faiss's HNSW cannot
remove points, and a rebuild per label is milliseconds at the paper's scale (K = 300 nodes x
200 samples = 6,000 keys per label), while key changes are rare; a rebuilt index is exact
about who is in it, where tombstones would not be.

**Exclusion.** Own samples never teach themselves: ``exclude`` names the querying origin. Its
samples of a label sit in one contiguous id range of that label's index, so the search asks
for ``r`` plus that range's length and drops ids inside it.

Neighbour sets depend only on keys, so they are memoised per (query keys, r, exclude) until a
rebuild; a query then costs a gather and a mean. Owns the cache and its indexes only: it never
verifies signatures, ages entries out or decides capacity (the node and protocol do that
before :meth:`put`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:  # imported where used: only knowledge mode needs it, not every start-up
    import faiss

T = TypeVar("T")

#: Below this many keys a label is searched exactly (IndexFlatIP); at and above, HNSW.
HNSW_MIN = 2048
#: HNSW graph degree and build/search breadth (faiss defaults are 32 / 40 / 16; a wider
#: search keeps recall high at the paper's R = 16 plus an excluded range).
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 128
#: Memoised neighbour sets kept (one per querying origin per r: the simulator's 300 nodes).
MEMO_ENTRIES = 1024
#: Unit keys are checked to this tolerance after normalising (a zero key cannot be one).
_NORM_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class KnowledgeBatch:
    """One origin's knowledge: keys, labels and logits of ``n`` of its samples."""

    origin: str
    version: int
    created_at: float
    keys: np.ndarray  # float [n, key_dim]
    labels: np.ndarray  # int [n]
    logits: np.ndarray  # float [n, num_classes]

    @property
    def samples(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True, slots=True)
class _Held:
    keys: np.ndarray  # float32 [n, d], unit rows
    labels: np.ndarray  # int64 [n]
    logits: np.ndarray  # float32 [n, C]
    version: int
    created_at: float


@dataclass
class _LabelIndex:
    index: faiss.Index
    #: Per origin holding samples of this label: its id range [lo, hi) in the index.
    ranges: dict[str, tuple[int, int]]
    #: id -> (origin position in ``order``, row in that origin's batch), for the logit gather.
    origin_pos: np.ndarray
    rows: np.ndarray
    order: tuple[str, ...]


class KnowledgeCache:
    """Per-label ANN indexes over the held keys; :meth:`teacher_logits` is eq. 17."""

    def __init__(self, key_dim: int, num_classes: int) -> None:
        if key_dim < 1 or num_classes < 2:
            raise ValueError(f"need key_dim >= 1 and num_classes >= 2 "
                             f"(got {key_dim}, {num_classes})")
        self.key_dim = key_dim
        self.num_classes = num_classes
        self._held: dict[str, _Held] = {}
        self._indexes: dict[int, _LabelIndex] = {}
        self._dirty: set[int] = set(range(num_classes))
        self._memo: OrderedDict[tuple[int, str, int, bytes], tuple[np.ndarray, ...]] = (
            OrderedDict())
        #: Bumped whenever any index is rebuilt: memoised neighbour ids refer to old ids.
        self._generation = 0
        #: Per label, all held logits in id order; rebuilt after a put or rebuild.
        self._label_logits: dict[int, np.ndarray] = {}
        self.rebuilds = 0  # label indexes built so far (tests and benchmarks read it)

    # ------------------------------------------------------------------ contents

    def __len__(self) -> int:
        return sum(h.labels.shape[0] for h in self._held.values())

    def origins(self) -> tuple[str, ...]:
        return tuple(sorted(self._held))

    def version_of(self, origin: str) -> int | None:
        held = self._held.get(origin)
        return None if held is None else held.version

    def put(self, batch: KnowledgeBatch) -> None:
        """Hold ``batch``, replacing ``batch.origin``'s previous one (validated first)."""
        held = self._validate(batch)
        old = self._held.get(batch.origin)
        same_keys = (old is not None and np.array_equal(old.labels, held.labels)
                     and np.array_equal(old.keys, held.keys))
        self._held[batch.origin] = held
        self._label_logits.clear()
        if not same_keys:
            touched = set(np.unique(held.labels).tolist())
            if old is not None:
                touched |= set(np.unique(old.labels).tolist())
            self._dirty |= touched

    def drop(self, origin: str) -> None:
        old = self._held.pop(origin, None)
        if old is not None:
            self._dirty |= set(np.unique(old.labels).tolist())
            self._label_logits.clear()

    # ------------------------------------------------------------------ queries

    def teacher_logits(
        self, keys: np.ndarray, labels: np.ndarray, *, r: int, exclude: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per local sample, the mean logits of its ``r`` nearest same-label keys held from
        origins other than ``exclude`` (eq. 17), and how many neighbours were found.

        Rows with no neighbour are zeros with count 0 (they distil nothing)."""
        if r < 1:
            raise ValueError(f"r must be >= 1, got {r}")
        q_keys, q_labels = self._check_query(keys, labels)
        n = q_labels.shape[0]
        out = np.zeros((n, self.num_classes), dtype=np.float32)
        counts = np.zeros(n, dtype=np.int64)
        if n == 0 or not self._held:
            return out, counts
        self._rebuild_dirty()
        neighbours = self._neighbours(q_keys, q_labels, r, exclude)
        for label, (rows, ids) in zip(range(self.num_classes), neighbours, strict=True):
            if rows.size == 0 or label not in self._indexes:
                continue  # nobody holds this label: zeros, count 0
            valid = ids >= 0
            found = valid.sum(axis=1)
            logits = self._logits_of(label)
            gathered = logits[np.where(valid, ids, 0)] * valid[..., None]
            total = gathered.sum(axis=1, dtype=np.float64)
            has = found > 0
            out[rows[has]] = (total[has] / found[has, None]).astype(np.float32)
            counts[rows] = found
        return out, counts

    # ------------------------------------------------------------------ internals

    def _validate(self, batch: KnowledgeBatch) -> _Held:
        if not isinstance(batch.origin, str) or not batch.origin:
            raise ValueError("origin must be a non-empty string")
        if not isinstance(batch.version, int) or batch.version < 0:
            raise ValueError(f"version must be an int >= 0, got {batch.version!r}")
        if not np.isfinite(batch.created_at):
            raise ValueError("created_at must be finite")
        keys, labels, logits = (np.asarray(batch.keys), np.asarray(batch.labels),
                                np.asarray(batch.logits))
        if labels.ndim != 1 or labels.shape[0] < 1:
            raise ValueError(f"labels must be [n >= 1], got shape {labels.shape}")
        n = labels.shape[0]
        if keys.shape != (n, self.key_dim):
            raise ValueError(f"keys must be [{n}, {self.key_dim}], got {keys.shape}")
        if logits.shape != (n, self.num_classes):
            raise ValueError(f"logits must be [{n}, {self.num_classes}], got {logits.shape}")
        if not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"labels must be integers, got {labels.dtype}")
        if labels.min() < 0 or labels.max() >= self.num_classes:
            raise ValueError(f"labels outside 0..{self.num_classes - 1}")
        for name, arr in (("keys", keys), ("logits", logits)):
            if not np.issubdtype(arr.dtype, np.floating):
                raise ValueError(f"{name} must be floating point, got {arr.dtype}")
            if not np.isfinite(arr).all():
                raise ValueError(f"{name} contain NaN or infinity")
        k32 = keys.astype(np.float32)
        norms = np.linalg.norm(k32, axis=1)
        if (norms < _NORM_EPS).any():
            raise ValueError("a key is zero: it names no sample")
        # Copies: the caller's arrays may change after put; the cache must not.
        return _Held((k32 / norms[:, None]).astype(np.float32), labels.astype(np.int64),
                     np.array(logits, dtype=np.float32), batch.version, float(batch.created_at))

    def _check_query(self, keys: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = np.asarray(keys)
        y = np.asarray(labels)
        if y.ndim != 1 or k.shape != (y.shape[0], self.key_dim):
            raise ValueError(f"query keys {k.shape} and labels {y.shape} do not match "
                             f"[n, {self.key_dim}] / [n]")
        if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0
                       or y.max() >= self.num_classes):
            raise ValueError(f"query labels must be integers in 0..{self.num_classes - 1}")
        k32 = np.ascontiguousarray(k, dtype=np.float32)
        if not np.isfinite(k32).all():
            raise ValueError("query keys contain NaN or infinity")
        norms = np.linalg.norm(k32, axis=1, keepdims=True)
        k32 = np.divide(k32, norms, out=np.zeros_like(k32), where=norms > _NORM_EPS)
        return k32, y.astype(np.int64)

    def _rebuild_dirty(self) -> None:
        if not self._dirty:
            return
        for label in sorted(self._dirty):
            built = self._build(label)
            if built is None:
                self._indexes.pop(label, None)
            else:
                self._indexes[label] = built
        self._dirty.clear()
        self._generation += 1
        self._memo.clear()
        self._label_logits.clear()

    def _build(self, label: int) -> _LabelIndex | None:
        order = tuple(o for o in sorted(self._held) if (self._held[o].labels == label).any())
        if not order:
            return None
        parts, pos, rows, ranges, lo = [], [], [], {}, 0
        for p, origin in enumerate(order):
            r = np.flatnonzero(self._held[origin].labels == label)
            parts.append(self._held[origin].keys[r])
            pos.append(np.full(r.size, p, dtype=np.int64))
            rows.append(r)
            ranges[origin] = (lo, lo + r.size)
            lo += r.size
        import faiss

        keys = np.ascontiguousarray(np.concatenate(parts))
        index: faiss.Index
        if keys.shape[0] < HNSW_MIN:
            index = faiss.IndexFlatIP(self.key_dim)
        else:
            index = faiss.IndexHNSWFlat(self.key_dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        _single_threaded(index.add, keys)
        self.rebuilds += 1
        return _LabelIndex(index, ranges, np.concatenate(pos), np.concatenate(rows), order)

    def _logits_of(self, label: int) -> np.ndarray:
        cached = self._label_logits.get(label)
        if cached is None:
            li = self._indexes[label]
            cached = np.empty((li.rows.size, self.num_classes), dtype=np.float32)
            for p, origin in enumerate(li.order):
                sel = li.origin_pos == p
                cached[sel] = self._held[origin].logits[li.rows[sel]]
            self._label_logits[label] = cached
        return cached

    def _neighbours(self, keys: np.ndarray, labels: np.ndarray, r: int,
                    exclude: str) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """Per label: (query rows of that label, their neighbour ids [m, r], -1 = none)."""
        digest = hashlib.blake2b(keys.tobytes() + labels.tobytes(), digest_size=16).digest()
        memo_key = (self._generation, exclude, r, digest)
        hit = self._memo.get(memo_key)
        if hit is not None:
            self._memo.move_to_end(memo_key)
            return _pairs(hit)
        import faiss

        flat: list[np.ndarray] = []
        for label in range(self.num_classes):
            rows = np.flatnonzero(labels == label)
            li = self._indexes.get(label)
            if rows.size == 0 or li is None:
                flat += [rows, np.full((rows.size, r), -1, dtype=np.int64)]
                continue
            lo, hi = li.ranges.get(exclude, (0, 0))
            k = min(li.index.ntotal, r + (hi - lo))
            if isinstance(li.index, faiss.IndexHNSWFlat):
                li.index.hnsw.efSearch = max(HNSW_EF_SEARCH, k)
            found = _single_threaded(li.index.search, keys[rows], k)
            ids = np.asarray(found[1], dtype=np.int64)
            ids[(ids >= lo) & (ids < hi)] = -1
            flat += [rows, _first_valid(ids, r)]
        self._memo[memo_key] = tuple(flat)
        while len(self._memo) > MEMO_ENTRIES:
            self._memo.popitem(last=False)
        return _pairs(tuple(flat))


def _single_threaded(fn: Callable[..., T], *args: Any) -> T:
    """Run a faiss call on one OpenMP thread. Building: a multi-threaded HNSW graph depends
    on the threads' interleaving, one thread keeps neighbours (and the simulator)
    reproducible. Searching: the queries of one node are few, and OpenMP's spinning workers
    cost more than they save on a busy machine (measured: ~16 ms a call on 2 shared cores)."""
    import faiss

    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        return fn(*args)
    finally:
        faiss.omp_set_num_threads(threads)


def _pairs(flat: tuple[np.ndarray, ...]) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    return tuple((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))


def _first_valid(ids: np.ndarray, r: int) -> np.ndarray:
    """The first ``r`` non-negative ids of each row, in rank order, padded with -1."""
    order = np.argsort(ids < 0, axis=1, kind="stable")  # valid ids first, rank kept
    ranked = np.take_along_axis(ids, order, axis=1)[:, :r]
    if ranked.shape[1] < r:
        ranked = np.pad(ranked, ((0, 0), (0, r - ranked.shape[1])), constant_values=-1)
    return ranked
