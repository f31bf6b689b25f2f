"""FedCache's accuracy metric, MAUA, and the per-client-best figure kept beside it.

MAUA as the paper defines it (seed ``fedcache-notes-zh.txt`` §3.1, "最大化所有客户端的平均UA",
and §5.1.2): the **maximum over evaluated rounds of the clients' average accuracy**, each
client measured on its own test split. The mean over clients of each client's *own* best round
is a different, larger number: with a few dozen test images a client, a maximum taken per
client over many noisy evaluations is biased upward. It is kept as ``mean_of_client_best``,
never called MAUA.

Accuracy matrices are ``[evaluations, clients]``; NaN marks a client without a test split (it
never has one, so its column is NaN at every evaluation) and is left out of every mean.
Pure numpy, so that the docs' renderer can recompute both figures from committed curves without
torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

#: What each row of a FedCache run's ``curves`` holds, in order (written into its JSON).
CURVE_COLUMNS = ("round", "mean_accuracy", "mean_of_client_best", "bytes")

#: The definition the ``maua`` fields of a run's JSON follow (written into its JSON; outputs
#: without it predate the fix and hold the mean of client best under that name).
MAUA_DEFINITION = "max over evaluated rounds of the mean client accuracy"


def _matrix(acc: npt.ArrayLike) -> npt.NDArray[np.float64]:
    m = np.asarray(acc, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] == 0:
        raise ValueError("need an [evaluations, clients] accuracy matrix with an evaluation")
    return m


def round_means(acc: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Each evaluation's mean accuracy over the clients that have a test split."""
    m = _matrix(acc)
    tested = ~np.isnan(m)
    if not tested.any(axis=1).all():
        raise ValueError("an evaluation with no client tested")
    means: npt.NDArray[np.float64] = np.where(tested, m, 0.0).sum(axis=1) / tested.sum(axis=1)
    return means


def maua(acc: npt.ArrayLike) -> float:
    """The paper's MAUA: the best evaluation's mean client accuracy."""
    return float(round_means(acc).max())


def mean_of_client_best(acc: npt.ArrayLike) -> float:
    """The mean over clients of each client's own best evaluation (not MAUA: biased up)."""
    m = _matrix(acc)
    # fmax skips NaN, so a client is NaN here only if it was never tested.
    best = np.fmax.reduce(m, axis=0)
    if np.isnan(best).all():
        raise ValueError("no client tested")
    return float(np.nanmean(best))


def maua_from_curve(curve: Sequence[Sequence[float]], upto: int | None = None) -> float:
    """MAUA from a run's curve rows (:data:`CURVE_COLUMNS`), over the rounds ``<= upto``: the
    rows keep each round's mean accuracy, which is all the paper's definition needs."""
    means = [float(r[1]) for r in curve if upto is None or r[0] <= upto]
    if not means:
        raise ValueError(f"no evaluated round <= {upto}")
    return max(means)


def acc_at(curve: Sequence[Sequence[float]], target: float) -> dict[str, int] | None:
    """The paper's acc@ (§5.1.2, Table 5's caption): the first evaluated round whose mean
    client accuracy reaches ``target`` and the curve's bytes by then; None if none does."""
    for row in curve:
        if float(row[1]) >= target:
            return {"round": int(row[0]), "bytes": int(row[3])}
    return None


def plateau_round(curve: Sequence[Sequence[float]], window: int, min_gain: float
                  ) -> int | None:
    """The first round at which a run counts as converged, by a rule stated before the run:
    the best mean client accuracy of the last ``window`` evaluated rows beats the best of
    every row before them by less than ``min_gain`` (a fraction: 0.002 is 0.2 points).
    None if the curve has not plateaued (or has no more than ``window`` rows).

    On the best, not on the last value, so that one noisy round neither stops a run that
    is still climbing nor keeps alive one that is not; the same quantity MAUA maximises."""
    if window < 1:
        raise ValueError(f"need window >= 1, got {window}")
    means = [float(r[1]) for r in curve]
    for end in range(window + 1, len(means) + 1):
        if max(means[end - window:end]) - max(means[:end - window]) < min_gain:
            return int(curve[end - 1][0])
    return None
