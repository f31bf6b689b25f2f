"""The shape of the code: the import graph of ``peerd``, ``peerd.protocol`` (protocol/) and
``peerd.cli`` (cli/), read with ``ast`` from the sources, never by importing them.

Every import counts, at module level, inside functions and under ``TYPE_CHECKING``: each
is a dependency a reader has to follow. The rules:

* no import cycle between modules of the project;
* the pure layer (``peerd.core`` and ``peerd.protocol``) imports nothing else of the
  project (third-party libraries are the purity tests' business);
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
