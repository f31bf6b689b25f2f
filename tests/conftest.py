"""Shared test settings: one torch thread (the machine has 2 cores shared by many tests)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # protocol tests must not need torch
    pass
