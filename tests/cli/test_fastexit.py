"""The console command ends as the interpreter would, minus the teardown of its modules
(``peerd.cli.fastexit``): same exit status, atexit handlers, flushed output, threads waited
for."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def ends(body: str) -> subprocess.CompletedProcess[str]:
    """A process whose ``main`` is ``body`` (indented into a function), run by
    ``run_and_exit``; a module-level object's ``__del__`` says whether finalization ran."""
    code = textwrap.dedent("""
        import atexit, sys, threading, time
        from peerd.cli.fastexit import run_and_exit

        class Finalized:
            def __del__(self) -> None:
                print("finalized", file=sys.stderr)

        witness = Finalized()
        atexit.register(lambda: print("atexit ran", flush=True))

        def main() -> None:
        {body}

        run_and_exit(main)
    """).format(body=textwrap.indent(textwrap.dedent(body), "    "))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)


def test_the_status_output_and_atexit_handlers_are_kept_and_the_teardown_skipped() -> None:
    done = ends("""
        print("buffered, no newline", end="")
        raise SystemExit(3)
    """)
    assert done.returncode == 3
    assert done.stdout == "buffered, no newlineatexit ran\n"
    assert "finalized" not in done.stderr  # the interpreter's teardown did not run


def test_a_return_is_status_0_and_a_message_is_status_1_on_stderr() -> None:
    assert ends("pass").returncode == 0
    message = ends('raise SystemExit("no such fleet")')
    assert (message.returncode, message.stderr) == (1, "no such fleet\n")


def test_a_running_thread_is_waited_for_on_the_ordinary_path() -> None:
    done = ends("""
        def late() -> None:
            time.sleep(0.3)
            print("thread done", flush=True)
        threading.Thread(target=late).start()
        raise SystemExit(4)
    """)
    assert done.returncode == 4
    assert done.stdout == "thread done\natexit ran\n"
    assert "finalized" in done.stderr  # the interpreter's own exit, teardown included
