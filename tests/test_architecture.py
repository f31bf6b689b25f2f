"""The shape of the code: the import graph of ``peerd``, ``peerd.protocol`` (protocol/) and
``peerd.cli`` (cli/), read with ``ast`` from the sources, never by importing them.

Every import counts, at module level, inside functions and under ``TYPE_CHECKING``: each
is a dependency a reader has to follow. The rules:

* no import cycle between modules of the project;
* the pure layer (``peerd.core`` and ``peerd.protocol``) imports nothing else of the
  project (third-party libraries are the purity tests' business);
* the stage order (docs/architecture.md, "Who imports whom"): a package imports only its own
  modules and the packages of lower layers (:data:`LAYERS`); two packages of one layer never
  import each other, except the two halves of the pure layer;
* no module sits directly in ``peerd/`` but ``__init__.py`` and ``__main__.py``: code
  belongs to the package of its stage of the data path.
"""

from __future__ import annotations

import ast
import itertools
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import peerd
import peerd.cli
import peerd.protocol

#: Package name -> its source directory (protocol/ and cli/ install as peerd.protocol/.cli).
ROOTS = {
    "peerd": Path(peerd.__file__).parent,
    "peerd.protocol": Path(peerd.protocol.__file__).parent,
    "peerd.cli": Path(peerd.cli.__file__).parent,
}
PURE = ("peerd.core", "peerd.protocol")
#: The import layers, lowest first (docs/architecture.md, "Who imports whom"). An entry
#: travels net -> node -> store -> learn -> control, but imports follow who calls whom: the
#: node is bookkeeping the store persists and the gossip driver (net) updates, so net, learn
#: and control all stand on node and store. The daemon wires every stage; the simulator and
#: the meshes reuse them without one another; the commands and the client library of an
#: external learner (a client of the daemon's sockets, like the commands), then ``peerd``
#: itself, sit on top.
LAYERS: tuple[tuple[str, ...], ...] = (
    PURE,
    ("peerd.node",),
    ("peerd.store",),
    ("peerd.net", "peerd.learn", "peerd.control"),
    ("peerd.daemon", "peerd.sim", "peerd.mesh"),
    ("peerd.cli", "peerd.client"),
    ("peerd",),  # peerd/__init__.py
)
ALLOWED_AT_TOP = {"__init__.py", "__main__.py"}


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.target}"


def module_files(roots: Mapping[str, Path]) -> dict[str, Path]:
    """Dotted module name -> file, for every module under ``roots``."""
    modules: dict[str, Path] = {}
    for package, directory in roots.items():
        for path in sorted(directory.rglob("*.py")):
            parts = path.relative_to(directory).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports_of(name: str, path: Path, modules: Mapping[str, Path]) -> list[Edge]:
    """The project modules ``name`` (at ``path``) imports, wherever the import statement is."""
    package = name if _is_package(path) else name.rpartition(".")[0]
    edges: list[Edge] = []

    def add(target: str, line: int) -> None:
        # `import a.b.c` where c is a class: the deepest prefix that is a module.
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            edges.append(Edge(name, target, line))

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            add(base, node.lineno)
            for alias in node.names:  # `from peerd.store import persist`: a submodule
                if f"{base}.{alias.name}" in modules:
                    add(f"{base}.{alias.name}", node.lineno)
    return edges


def import_graph(roots: Mapping[str, Path]) -> dict[str, list[Edge]]:
    modules = module_files(roots)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycles(graph: Mapping[str, Iterable[Edge]]) -> list[list[Edge]]:
    """One shortest cycle per strongly connected component of more than one module."""
    succ = {n: sorted({e.target for e in es}) for n, es in graph.items()}
    edge_at = {(e.source, e.target): e for es in graph.values() for e in es}
    # Tarjan's algorithm, iterative (the graph is small, but recursion depth is no worry then).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            nexts = succ.get(node, [])
            if i < len(nexts):
                work.append((node, i + 1))
                nxt = nexts[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    cycles = []
    for component in components:
        if len(component) < 2:
            continue
        inside = set(component)
        start = component[0]
        # Breadth-first from start back to start, within the component: the shortest cycle.
        came_from: dict[str, str] = {}
        frontier = [start]
        while start not in came_from:
            nxt_frontier = []
            for node in frontier:
                for nxt in succ[node]:
                    if nxt in inside and nxt not in came_from:
                        came_from[nxt] = node
                        nxt_frontier.append(nxt)
            frontier = nxt_frontier
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(came_from[path[-1]])
        path.reverse()
        cycles.append([edge_at[(a, b)] for a, b in itertools.pairwise(path)])
    return cycles


def _in(name: str, packages: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def pure_layer_violations(graph: Mapping[str, Iterable[Edge]]) -> list[Edge]:
    return [e for source, es in graph.items() if _in(source, PURE)
            for e in es if not _in(e.target, PURE)]


def package_of(module: str) -> str:
    """The layered package a module belongs to (``peerd`` for the top-level modules)."""
    named = {p for layer in LAYERS for p in layer}
    head = ".".join(module.split(".")[:2])
    return head if head in named else "peerd"


def layer_of(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def stage_order_violations(graph: Mapping[str, Iterable[Edge]]) -> list[Edge]:
    """Imports of a package's own layer or a higher one (the pure layer's halves excepted)."""
    bad = []
    for source, es in graph.items():
        mine = package_of(source)
        for e in es:
            theirs = package_of(e.target)
            if theirs == mine or (mine in PURE and theirs in PURE):
                continue
            if layer_of(theirs) >= layer_of(mine):
                bad.append(e)
    return bad


def _explain(cycles: list[list[Edge]]) -> str:
    return "\n".join(
        " -> ".join([c[0].source, *(e.target for e in c)])
        + "".join(f"\n    {e}" for e in c) for c in cycles)


GRAPH = import_graph(ROOTS)


def test_the_graph_covers_the_three_packages_and_sees_function_level_imports() -> None:
    assert {"peerd.core.cache", "peerd.protocol.wire", "peerd.cli.app"} <= GRAPH.keys()
    assert "peerd.protocol.limits" in {e.target for e in GRAPH["peerd.protocol.wire"]}
    assert "peerd.daemon.config" in {e.target for e in GRAPH["peerd.daemon.daemon"]}
    # peerd.cli.run imports the daemon inside its command function.
    assert "peerd.daemon.daemon" in {e.target for e in GRAPH["peerd.cli.run"]}


def test_there_is_no_import_cycle() -> None:
    cycles = find_cycles(GRAPH)
    print(_explain(cycles))
    assert cycles == [], "import cycles:\n" + _explain(cycles)


def test_core_and_protocol_import_nothing_else_of_the_project() -> None:
    bad = pure_layer_violations(GRAPH)
    assert bad == [], "\n".join(map(str, bad))


def test_every_package_imports_only_lower_layers_of_the_stage_order() -> None:
    bad = stage_order_violations(GRAPH)
    assert bad == [], "imports against the stage order:\n" + "\n".join(map(str, bad))


def test_every_package_of_peerd_has_a_place_in_the_stage_order() -> None:
    # A new stage must be placed in LAYERS (and in docs/architecture.md) before it counts:
    # package_of would otherwise file its modules under top-level ``peerd``, allowed anything.
    packages = {f"peerd.{p.parent.name}" for p in ROOTS["peerd"].glob("*/__init__.py")}
    packages |= {"peerd.protocol", "peerd.cli"}
    assert packages == {p for layer in LAYERS for p in layer} - {"peerd"}


def test_no_module_sits_directly_in_peerd() -> None:
    top = {p.name for p in ROOTS["peerd"].glob("*.py")}
    assert top <= ALLOWED_AT_TOP, sorted(top - ALLOWED_AT_TOP)


# --- the walker itself, on a made-up project ------------------------------------------------


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for rel, source in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return tmp_path


def test_a_cycle_through_a_function_level_and_a_relative_import_is_found(
    tmp_path: Path,
) -> None:
    root = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import thing\n",
        "pkg/b.py": "def f():\n    from .sub import c\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from .. import a\nimport os\n",
        "pkg/d.py": "import pkg.a\n",  # leads into the cycle, is not part of it
    })
    cycles = find_cycles(import_graph({"pkg": root / "pkg"}))
    assert _explain(cycles).splitlines()[0] == "pkg.a -> pkg.b -> pkg.sub.c -> pkg.a"
    assert [str(e) for e in cycles[0]] == [
        "pkg.a:1 imports pkg.b", "pkg.b:2 imports pkg.sub.c", "pkg.sub.c:1 imports pkg.a"]


def test_a_pure_module_importing_the_rest_of_the_project_is_reported(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "peerd/__init__.py": "",
        "peerd/core/__init__.py": "",
        "peerd/core/x.py": "from peerd.core import y\nfrom peerd.protocol.w import F\n",
        "peerd/core/y.py": "",
        "peerd/protocol/__init__.py": "",
        "peerd/protocol/w.py": "F = 1\n",
        "peerd/protocol/v.py": "def f():\n    from peerd.store.s import g\n",
        "peerd/store/__init__.py": "",
        "peerd/store/s.py": "import peerd.core.x\n",
    })
    graph = import_graph({"peerd": root / "peerd"})
    assert [str(e) for e in pure_layer_violations(graph)] == [
        "peerd.protocol.v:2 imports peerd.store.s"]
    assert find_cycles(graph) == []


def test_imports_against_the_stage_order_are_reported_and_the_allowed_ones_are_not(
    tmp_path: Path,
) -> None:
    # The three imports issue 25 found, a sibling import and, around them, allowed ones.
    root = _tree(tmp_path, {
        "peerd/__init__.py": "",
        **{f"peerd/{p}/__init__.py": "" for p in (
            "core", "protocol", "node", "store", "net", "learn", "control", "daemon", "cli")},
        "peerd/core/c.py": "from peerd.protocol import w\n",
        "peerd/protocol/w.py": "import peerd.core.c\n",
        "peerd/node/state.py": "from peerd.store.spool import MappedFrame\nimport peerd.core.c\n",
        "peerd/store/spool.py": "from peerd.net.framing import MemorySink\n",
        "peerd/store/persist.py": "from peerd.node.state import Held\n",
        "peerd/net/framing.py": "from peerd.node import state\nfrom peerd.store import persist\n",
        "peerd/learn/policy.py": "def f():\n    from peerd.daemon.config import C\n",
        "peerd/control/status.py": "from peerd.learn import policy\nimport peerd.store.spool\n",
        "peerd/daemon/config.py": "from peerd.learn import policy\nfrom peerd.net import framing\n",
        "peerd/cli/app.py": "import peerd.daemon.config\n",
    })
    graph = import_graph({"peerd": root / "peerd"})
    assert sorted(map(str, stage_order_violations(graph))) == [
        "peerd.control.status:1 imports peerd.learn",  # its __init__ runs too
        "peerd.control.status:1 imports peerd.learn.policy",
        "peerd.learn.policy:2 imports peerd.daemon.config",
        "peerd.node.state:1 imports peerd.store.spool",
        "peerd.store.spool:1 imports peerd.net.framing",
    ]
