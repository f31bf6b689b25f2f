"""How the console command ends: as the interpreter would, minus its teardown of every module.

After `peerd run` (or any command that loaded torch and libp2p) returns, CPython's
finalization frees each module and object one by one: 0.5 s of CPU per process on the
2-core test machine (``import peerd.daemon.daemon`` then exit: 2.20 s user against 1.73 s with
``os._exit``), which a systemd stop, a restart and every daemon a test stops waits for. The
memory goes back to the OS with the process anyway. What the interpreter does at exit that
has an effect outside the process is kept, in its order: the ``atexit`` handlers (logging's
flush and close, temporary directories, ...), then stdout and stderr flushed (exit status
120 if that fails, as CPython's). A non-daemon thread still running, which the interpreter
would wait for, sends the exit down the ordinary path instead.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable


def run_and_exit(main: Callable[[], object]) -> None:
    """Run ``main`` (a click/typer app: it ends with :class:`SystemExit`) and end the
    process with its exit status."""
    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    others = [t for t in threading.enumerate()
              if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if others:  # the interpreter joins them (and runs threading's own exit hooks) first
        raise SystemExit(code)
    os._exit(_finish(code))


def _finish(code: object) -> int:
    """What the interpreter would do with ``SystemExit(code)`` up to freeing the modules;
    the process's exit status."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): printed, status 1
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`peerd status | head`)
            status = 120
    return status
