"""`peerd run` with a wall clock the soak can step (tests only; the daemon is unchanged).

    python -m tests.integration.stepped_clock --config peerd.toml --offset-file F

The daemon reads time through its injected ``clock`` (``Daemon(cfg, clock=...)``): entry
timestamps, staleness, expiry and verification's "now" all come from it. Here that clock is
``time.time()`` plus the number of seconds in ``F`` (re-read at most every
:data:`REREAD_S`), so a test steps one node's clock by ±10 minutes while it runs, without
touching the machine's clock or any other process. libfaketime was tried first: it breaks
Python's monotonic ``time.sleep`` unless it also fakes the monotonic clock, which trio must
not see jump.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
from pathlib import Path

import trio

from peerd.daemon.config import load_config
from peerd.daemon.daemon import Daemon

#: How stale the offset may be: a step takes effect within this.
REREAD_S = 0.5


class SteppedClock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0.0
        self.read_at = float("-inf")

    def __call__(self) -> float:
        now = time.monotonic()
        if now - self.read_at >= REREAD_S:
            self.read_at = now
            # On a bad read keep the last offset: the soak writes the file atomically.
            with contextlib.suppress(OSError, ValueError):
                self.offset = float(self.path.read_text().strip() or 0)
        return time.time() + self.offset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True, type=Path)
    p.add_argument("--offset-file", required=True, type=Path)
    args = p.parse_args()
    cfg = load_config(args.config)
    logging.basicConfig(level=cfg.node.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    trio.run(Daemon(cfg, clock=SteppedClock(args.offset_file)).run)


if __name__ == "__main__":
    main()
