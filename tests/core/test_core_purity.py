"""peerd.core stays pure: no I/O (files, sockets, threads, event loops, clock reads) and no
global RNG (time and torch.Generator come in as arguments). The rules are in tests/purity.py;
the last tests show that the checker catches what it claims to."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import peerd.core
from tests.purity import impurities, package_impurities

CORE_DIR = Path(peerd.core.__file__).parent
#: Modules that must stay importable without torch: the daemon's config (and `peerd status`)
#: import them, and peerd.protocol imports reasons.
TORCH_FREE = ("peerd.core.reasons", "peerd.core.limits", "peerd.core.alpha",
              "peerd.core.blendrules", "peerd.core.updatenorm", "peerd.core.timebuckets")


def _loaded_after(imports: list[str], suspects: tuple[str, ...]) -> list[str]:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in imports)
        + f"print(','.join(m for m in {suspects!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return [m for m in out.stdout.strip().split(",") if m]


def test_no_core_module_does_io_reads_the_clock_or_uses_a_global_rng() -> None:
    assert sorted(CORE_DIR.glob("*.py"))  # the glob found the package
    assert package_impurities(CORE_DIR) == []


def test_importing_every_core_module_pulls_in_no_event_loop_or_network() -> None:
    # torch itself loads asyncio, threading and socket, so only our own I/O stack is checked.
    modules = [f"peerd.core.{p.stem}" for p in sorted(CORE_DIR.glob("*.py"))]
    assert _loaded_after(modules, ("trio", "libp2p", "zeroconf", "ifaddr")) == []


def test_light_core_modules_import_no_torch() -> None:
    assert _loaded_after(list(TORCH_FREE), ("torch",)) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os", "imports os"),
        ("from pathlib import Path", "imports pathlib"),
        ("import time\ndef f():\n    return time.monotonic()", "imports time"),
        ("def f():\n    import socket", "imports socket"),
        ("def f(p):\n    return open(p)", "calls open()"),
        ("import random\nx = random.random()", "global RNG: random.random"),
        ("import random\nf = random.shuffle", "global RNG: random.shuffle"),
        ("from random import seed", "global RNG: random.seed"),
        ("import random\nr = random.Random()", "unseeded random.Random() draws OS entropy"),
        ("import numpy as np\nnp.random.seed(0)", "global RNG: numpy.random.seed"),
        ("import numpy as np\nx = np.random.rand(3)", "global RNG: numpy.random.rand"),
        ("from numpy import random as npr\nnpr.shuffle([])", "global RNG: numpy.random.shuffle"),
        ("import numpy as np\ng = np.random.default_rng()",
         "unseeded numpy.random.default_rng() draws OS entropy"),
        ("import torch\ntorch.manual_seed(0)", "global RNG: torch.manual_seed"),
        ("import torch\ns = torch.seed()", "global RNG: torch.seed"),
        ("import torch\nwith torch.random.fork_rng():\n    pass",
         "global RNG: torch.random.fork_rng"),
        ("import torch\nx = torch.randn(3)", "torch.randn() without generator="),
        ("from torch import randperm\np = randperm(5)", "torch.randperm() without generator="),
        ("import torch as t\nx = t.normal(0.0, 1.0, (2,))", "torch.normal() without generator="),
        ("def f(w):\n    w.uniform_(-1, 1)", "uniform_() without generator= draws from torch's "
                                             "global RNG"),
        ("from torch import nn\nnn.init.kaiming_uniform_(w)",
         "kaiming_uniform_() without generator= draws from torch's global RNG"),
    ],
)
def test_the_checker_catches(tmp_path: Path, source: str, expected: str) -> None:
    path = tmp_path / "m.py"
    path.write_text(source + "\n")
    assert [f.what for f in impurities(path)] == [expected]


def test_the_checker_accepts_randomness_that_is_handed_in(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(textwrap.dedent("""
        import random
        import numpy as np
        import torch

        def f(n: int, gen: torch.Generator, seed: int) -> object:
            rng = random.Random(seed)
            g = np.random.default_rng(seed)
            w = torch.empty(3).uniform_(-1, 1, generator=gen)
            return rng.random(), g.normal(), torch.randperm(n, generator=gen), w, \\
                torch.Generator().manual_seed(seed)
    """))
    assert impurities(path) == []
