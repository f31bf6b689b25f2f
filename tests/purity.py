"""The AST check behind the purity tests of ``peerd.protocol`` and ``peerd.core``.

Owns the list of what a pure (sans-IO, deterministic) package must not use: I/O modules
(files, sockets, processes, threads, event loops, clocks, OS entropy), I/O builtins, and
randomness that is not handed in (module-level ``random`` functions, ``numpy.random``'s
global state, torch's global generator). A seeded ``random.Random(seed)``,
``np.random.default_rng(seed)`` and an explicit ``generator=`` are fine: the caller owns
them, so the result is reproducible. It reads source files only; it must not import the
packages it checks.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

#: Modules that touch the world (files, sockets, processes, threads, event loops, the clock,
#: OS entropy) or load code by name. Matched on the first dotted component.
IO_MODULES = frozenset({
    "os", "pathlib", "shutil", "tempfile", "glob", "io", "mmap", "fcntl",
    "socket", "ssl", "select", "selectors", "socketserver", "http", "urllib",
    "asyncio", "trio", "anyio", "threading", "_thread", "multiprocessing", "concurrent",
    "subprocess", "signal", "time", "datetime", "secrets", "importlib",
    "libp2p", "zeroconf", "ifaddr",
})
#: Builtins that do I/O or run code by name.
IO_BUILTINS = frozenset({"open", "input", "print", "breakpoint", "exec", "eval", "__import__"})

#: ``random``: only a local, seeded instance (``random.Random(seed)``).
RANDOM_ALLOWED = frozenset({"Random"})
#: ``numpy.random``: constructors of local generators; everything else is global state.
NUMPY_RANDOM_ALLOWED = frozenset({
    "default_rng", "Generator", "RandomState", "SeedSequence", "BitGenerator",
    "PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937",
})
#: Constructors that draw OS entropy when called without a seed.
NEEDS_SEED = frozenset({
    "random.Random", "numpy.random.default_rng", "numpy.random.RandomState",
    "numpy.random.SeedSequence", "numpy.random.PCG64", "numpy.random.PCG64DXSM",
    "numpy.random.Philox", "numpy.random.SFC64", "numpy.random.MT19937",
})
#: torch functions that read or reseed the global generator.
TORCH_GLOBAL_RNG = frozenset({
    "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state", "fork_rng",
    "manual_seed_all", "seed_all",
})
TORCH_MODULES = frozenset({"torch", "torch.random", "torch.cuda"})
#: torch samplers that use the global generator unless ``generator=`` is passed.
TORCH_SAMPLERS = frozenset({
    "rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "poisson",
    "rand_like", "randn_like", "randint_like",
})
#: In-place samplers (tensor methods and ``torch.nn.init``), whatever the receiver:
#: the same rule. The names are torch's own; no numpy or stdlib API spells them so.
IN_PLACE_SAMPLERS = frozenset({
    "uniform_", "normal_", "random_", "bernoulli_", "exponential_", "geometric_", "cauchy_",
    "log_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
    "trunc_normal_", "orthogonal_", "sparse_",
})


@dataclass(frozen=True, slots=True)
class Finding:
    path: Path
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path.name}:{self.line}: {self.what}"


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _has_generator(call: ast.Call) -> bool:
    return any(k.arg in ("generator", None) for k in call.keywords)  # None: **kwargs


def _has_seed(call: ast.Call) -> bool:
    return bool(call.args) or bool(call.keywords)


def rng_use(full: str, call: ast.Call | None) -> str | None:
    """Why the resolved name ``full`` (called by ``call``, if given) is impure, else None."""
    module, _, name = full.rpartition(".")
    if module == "random" and name not in RANDOM_ALLOWED:
        return f"global RNG: {full}"
    if module == "numpy.random" and name not in NUMPY_RANDOM_ALLOWED:
        return f"global RNG: {full}"
    if full in NEEDS_SEED and call is not None and not _has_seed(call):
        return f"unseeded {full}() draws OS entropy"
    if module in TORCH_MODULES and name in TORCH_GLOBAL_RNG:
        return f"global RNG: {full}"
    if module == "torch" and name in TORCH_SAMPLERS and call is not None:
        return None if _has_generator(call) else f"{full}() without generator="
    return None


class _Checker(ast.NodeVisitor):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.findings: list[Finding] = []
        #: Local name -> the dotted module or object it stands for (``np`` -> ``numpy``).
        self.names: dict[str, str] = {}
        #: Function expressions already judged as calls (so not again as bare references).
        self.called: set[int] = set()

    def _flag(self, node: ast.AST, what: str | None) -> None:
        if what is not None:
            self.findings.append(Finding(self.path, getattr(node, "lineno", 0), what))

    def _check_module(self, node: ast.AST, module: str) -> None:
        if module.split(".")[0] in IO_MODULES:
            self._flag(node, f"imports {module}")

    def _resolve(self, expr: ast.expr) -> str | None:
        dotted = _dotted(expr)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        base = self.names.get(head)
        if base is None:
            return None
        return f"{base}.{rest}" if rest else base

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)
            local = alias.asname or alias.name.split(".")[0]
            self.names[local] = alias.name if alias.asname else local

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level > 0:  # a relative import stays inside the checked package
            return
        module = node.module or ""
        self._check_module(node, module)
        for alias in node.names:
            full = f"{module}.{alias.name}"
            self.names[alias.asname or alias.name] = full
            self._flag(node, rng_use(full, None))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        self.called.add(id(func))
        if isinstance(func, ast.Name) and func.id in IO_BUILTINS and func.id not in self.names:
            self._flag(node, f"calls {func.id}()")
        full = self._resolve(func)
        if full is not None:
            self._flag(node, rng_use(full, node))
        last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if last in IN_PLACE_SAMPLERS and not _has_generator(node):
            self._flag(node, f"{last}() without generator= draws from torch's global RNG")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        # A reference that is not called (``f = random.random``) leaks the global RNG too.
        if id(node) not in self.called:
            full = self._resolve(node)
            if full is not None:
                self._flag(node, rng_use(full, None))
        self.generic_visit(node)


def impurities(path: Path) -> list[Finding]:
    """What in ``path`` does I/O, reads the clock, or uses a global RNG."""
    checker = _Checker(path)
    checker.visit(ast.parse(path.read_text(), filename=str(path)))
    return checker.findings


def package_impurities(directory: Path) -> list[str]:
    """:func:`impurities` of every module of a package directory, as printable lines."""
    return [str(f) for path in sorted(directory.glob("*.py")) for f in impurities(path)]
