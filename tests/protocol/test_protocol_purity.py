"""peerd.protocol stays pure: no torch, no I/O (files, sockets, threads, event loops, clock
reads), no randomness at all, no pickle. The shared rules are in tests/purity.py."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import peerd.protocol
from tests.purity import package_impurities

PROTOCOL_DIR = Path(peerd.protocol.__file__).parent
#: Beyond the shared rules: the wire format needs no torch and no randomness (keys come from
#: `cryptography`), and hostile bytes must never reach pickle.
PROTOCOL_FORBIDDEN = {"torch", "random", "numpy.random", "pickle", "marshal", "shelve"}
#: Modules whose presence after importing all of peerd.protocol means I/O crept in through
#: a dependency (os and pathlib are always loaded by Python itself, so they prove nothing).
RUNTIME_FORBIDDEN = ("torch", "trio", "asyncio", "socket", "selectors", "threading",
                     "subprocess", "mmap", "libp2p", "zeroconf")


def test_importing_every_protocol_module_pulls_in_no_torch_or_io() -> None:
    modules = sorted(p.stem for p in PROTOCOL_DIR.glob("*.py") if p.stem != "__init__")
    assert modules  # the glob found the package
    code = (
        "import sys\n"
        + "".join(f"import peerd.protocol.{m}\n" for m in modules)
        + f"bad = sorted(m for m in {RUNTIME_FORBIDDEN!r} if m in sys.modules)\n"
        + "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == ""


def test_no_protocol_module_does_io_reads_the_clock_or_uses_a_global_rng() -> None:
    assert package_impurities(PROTOCOL_DIR) == []


def test_no_protocol_module_imports_torch_randomness_or_pickle() -> None:
    offenders = []
    for path in sorted(PROTOCOL_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            offenders += [
                f"{path.name}: {n}" for n in names
                if n.split(".")[0] in PROTOCOL_FORBIDDEN or n in PROTOCOL_FORBIDDEN
            ]
    assert offenders == []
