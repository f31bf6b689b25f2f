"""Time buckets: sample ids for devices that observe the same moments (cordial mode, sensors).

Time is cut into buckets of ``bucket_s`` seconds from the Unix epoch; bucket k = ⌊t / bucket_s⌋
is one sample every node of a fleet sees, and its **id** on the wire is k mod
:data:`VIEW_IDS`: a ring, so ids stay small int32 values and a view schema's index stays bounded
however long the fleet runs. Two buckets of a window never share an id (a window spans fewer
than :data:`VIEW_IDS` buckets), and a received id is read as the bucket of the receiver's
window on that place of the ring, which is right as long as a view is never older than
:func:`ring_slack` allows (the config checks τ_max against it).

Owns that arithmetic. Pure: times come in as arguments; no torch (the config imports it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

#: The ring of bucket ids. Large enough that a window plus τ_max of staleness never wraps
#: onto itself at sensible bucket widths (the config checks it), small enough to keep ids
#: plain int32 values.
VIEW_IDS = 1 << 16


def bucket_of(t: float, bucket_s: float) -> int:
    """The bucket holding time ``t`` (seconds since the Unix epoch): ⌊t / bucket_s⌋."""
    if not bucket_s > 0 or not math.isfinite(t) or t < 0:
        raise ValueError(f"need t >= 0 and bucket_s > 0, got t={t!r}, bucket_s={bucket_s!r}")
    return math.floor(t / bucket_s)


def bucket_id(bucket: int, view_ids: int = VIEW_IDS) -> int:
    """A bucket's id on the wire: its number on the ring of ``view_ids`` ids."""
    return bucket % view_ids


def window_ids(buckets: Sequence[int], view_ids: int = VIEW_IDS
               ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
    """The ids of a window of distinct buckets, sorted (a view's ids are strictly increasing),
    and the order that sorts them: ``ids = (buckets % view_ids)[order]``. Where the window
    straddles the ring's wrap, its newest buckets get the smallest ids. A window must span
    fewer than ``view_ids`` buckets, or two of its buckets would share an id."""
    arr = np.asarray(buckets, dtype=np.int64)
    if len(arr) and int(arr.max()) - int(arr.min()) >= view_ids:
        raise ValueError(f"a window of buckets {int(arr.min())}..{int(arr.max())} spans "
                         f"{view_ids} ids or more: ids would repeat")
    ids = arr % view_ids
    order = np.argsort(ids, kind="stable")
    return ids[order].astype(np.int32), order


def ring_slack(window: int, tau_max: float, bucket_s: float, view_ids: int = VIEW_IDS) -> int:
    """Ids to spare on the ring when views are up to τ_max old: a peer's window may lag the
    receiver's by ⌈τ_max / bucket_s⌉ buckets, and the two windows together must still span
    fewer than ``view_ids`` buckets, or an old id would be read as a new bucket. Negative:
    the settings alias."""
    lag = math.ceil(tau_max / bucket_s)
    return view_ids - (window + lag + 1)
