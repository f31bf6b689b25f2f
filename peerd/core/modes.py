"""The learning modes' names, as plain data: what ``[learning] mode`` may say, what the mode
registry (peerd.daemon.modes) is keyed by, and what ``peerd status`` reports.

Torch-free on purpose, like :mod:`peerd.core.blendrules`: the config names a mode without
loading any mode's code.
"""

from __future__ import annotations

from enum import StrEnum


class ModeName(StrEnum):
    """One learning mode: what a node gossips and how its round trains."""

    #: Cached-DFL: models are exchanged and blended (the default).
    WEIGHTS = "weights"
    #: FedCache: per-sample logits are exchanged, the local model distils from them.
    KNOWLEDGE = "knowledge"
    #: Cordial learning on Pairwise-10: agents exchange embedded outputs (views).
    CORDIAL = "cordial"
    #: Cordial learning on sensor agents whose samples are aligned by time buckets.
    SENSORS = "sensors"
