"""peerd.protocol stays pure: no torch, no sockets, no event loop, no clock reads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import peerd.protocol

PROTOCOL_DIR = Path(peerd.protocol.__file__).parent
FORBIDDEN_MODULES = {
    "torch",
    "socket",
    "asyncio",
    "trio",
    "selectors",
    "time",
    "datetime",
    "random",
    "secrets",
    "pickle",
}


def test_importing_every_protocol_module_pulls_in_no_torch_or_io() -> None:
    modules = sorted(p.stem for p in PROTOCOL_DIR.glob("*.py") if p.stem != "__init__")
    code = (
        "import sys\n"
        + "".join(f"import peerd.protocol.{m}\n" for m in modules)
        + "bad = sorted(m for m in ('torch', 'trio', 'asyncio') if m in sys.modules)\n"
        + "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == ""


def test_no_protocol_module_imports_clock_randomness_sockets_or_pickle() -> None:
    offenders = []
    for path in PROTOCOL_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN_MODULES
            ]
    assert offenders == []
