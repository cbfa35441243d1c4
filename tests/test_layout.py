"""The shape of the house: no import cycle in the package, deferred imports included.

A cycle hidden behind an import inside a function still couples two modules both ways; it only
moves the failure from import time to call time. The graph is read from the source with ``ast``
(every ``import`` statement, at module level or not), so nothing is imported to check it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sidecar"


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package modules it imports (``from . import x`` counts as importing ``x``)."""
    modules = {_module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, is_package, node)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in modules:  # `sidecar.capacity.blocks.x` -> its module
                    name = name.rpartition(".")[0]
                if name and name != module:
                    graph[module].add(name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm).

    Every edge counts, those between a package's ``__init__`` and its own submodules too: a chain
    ``a -> pkg -> pkg.b -> a`` is a cycle even though one of its steps is a package re-exporting a part.
    """
    edges = graph
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_deferred_imports(tmp_path):
    """A cycle closed by an import inside a function is found (else the check below could not fail)."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import g\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    graph = import_graph(pkg)
    assert graph["pkg.c"] == {"pkg.a"}
    assert find_cycles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_a_cycle_through_a_package_init_is_found(tmp_path):
    """``a -> sub (its __init__ re-exports b) -> sub.b -> a`` is a cycle."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import sub\n")
    (pkg / "sub" / "__init__.py").write_text("from .b import f\n")
    (pkg / "sub" / "b.py").write_text("from ..a import g\n")
    assert find_cycles(import_graph(pkg)) == [["pkg.a", "pkg.sub", "pkg.sub.b"]]


def test_no_import_cycle():
    assert find_cycles(import_graph()) == []


def test_contributing_lists_every_module():
    """CONTRIBUTING.md's tree names each module of the package once, and nothing that is gone."""
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    tree = text.split("```text\nsidecar/\n", 1)[1].split("```", 1)[0]
    listed, folders = set(), []
    for line in tree.splitlines():
        indent = (len(line) - len(line.lstrip())) // 2
        name = line.split()[0]
        folders = folders[: indent - 1]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        else:
            listed.add("/".join([*folders, name]))
    actual = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    assert listed == actual, f"missing from CONTRIBUTING.md: {actual - listed}; gone: {listed - actual}"
