"""The shape of the house: the layers and which may import which, and no import cycle.

A module may import modules of its own layer and of the layers below it, never above (a row's
``may import`` column). The table is :data:`LAYERS`; :func:`test_the_docstring_shows_the_table` keeps
this copy of it true:

    layer     may import                 modules
    core      core                       sidecar (the version), units, reasons, thresholds,
                                         alert_params, reload_status, generations, limits, metrics,
                                         observation, derive, page_parser, input_files, atomic_write,
                                         logs, capacity.*, forecast.*, engine_cmdline
    engines   core                       engines.*
    config    core, engines              setting_parsers, settings, config, model_discovery
    layers    core .. config             state, exporter, layers.*
    pipeline  core .. layers             pipeline
    edge      core .. pipeline           scrape, page_readers, history, history_writer, model_source,
                                         process_discovery, scrape_loop, reload, webconfig, endpoint,
                                         daemon, outbound, prometheus_api
    apps      every layer                cli, demo, replay, forecast_validation, capacity.cli,
                                         artifacts.*, report.*, simulator.*

``settings`` sits above ``engines`` because ``targets[].engine`` lists the adapters. A module's row
is its longest matching entry (``capacity.cli`` is an app, the rest of ``capacity.*`` is core; ``x.*``
is the package ``x`` and every module under it). Known exceptions (:data:`KNOWN_EXCEPTIONS`) are
edges of today's code that break the table, each with why and what removes it; one that no longer
occurs fails the test too, so the list stays true. Today there is none.

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


#: The layers, lowest first: (name, modules). A module is named without the ``sidecar.`` prefix
#: (``sidecar`` itself is the package's ``__init__``); ``x.*`` is the package ``x`` and every module under it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "core",
        (
            "sidecar",
            "units",
            "reasons",
            "thresholds",
            "alert_params",
            "reload_status",
            "generations",
            "limits",
            "metrics",
            "observation",
            "derive",
            "page_parser",
            "input_files",
            "atomic_write",
            "logs",
            "capacity.*",
            "forecast.*",
            "engine_cmdline",
        ),
    ),
    ("engines", ("engines.*",)),
    ("config", ("setting_parsers", "settings", "config", "model_discovery")),
    ("layers", ("state", "exporter", "layers.*")),
    ("pipeline", ("pipeline",)),
    (
        "edge",
        (
            "scrape",
            "page_readers",
            "history",
            "history_writer",
            "model_source",
            "process_discovery",
            "scrape_loop",
            "reload",
            "webconfig",
            "endpoint",
            "daemon",
            "outbound",
            "prometheus_api",
        ),
    ),
    (
        "apps",
        (
            "cli",
            "demo",
            "replay",
            "forecast_validation",
            "capacity.cli",
            "artifacts.*",
            "report.*",
            "simulator.*",
        ),
    ),
)

#: Imports of today's code that go up the table: (importer, imported) -> why, and what removes it.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


def _short(module: str) -> str:
    return module if module == "sidecar" else module.removeprefix("sidecar.")


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> int | None:
    """The index in ``layers`` of ``module``'s row (its longest matching entry), None when it has none."""
    name, best = _short(module), None
    for index, (_, entries) in enumerate(layers):
        for entry in entries:
            package = entry.removesuffix(".*") if entry.endswith(".*") else None
            if entry == name or (package is not None and (name == package or name.startswith(package + "."))):
                if best is None or len(entry) > best[0]:
                    best = (len(entry), index)
    return None if best is None else best[1]


def upward_imports(
    graph: dict[str, set[str]], layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS
) -> dict[tuple[str, str], str]:
    """Every import of a module from a higher layer: (importer, imported) -> "layer -> layer"."""
    out: dict[tuple[str, str], str] = {}
    for module, imported in graph.items():
        low = layer_of(module, layers)
        for dep in imported:
            high = layer_of(dep, layers)
            if low is not None and high is not None and high > low:
                out[(_short(module), _short(dep))] = f"{layers[low][0]} -> {layers[high][0]}"
    return out


def test_every_module_has_a_layer():
    """A new module needs a row: where it sits is a decision, not an accident."""
    missing = sorted(_short(m) for m in import_graph() if layer_of(m) is None)
    assert not missing, f"add these modules to LAYERS in tests/test_layout.py: {missing}"


def test_imports_go_down_the_layers():
    upward = upward_imports(import_graph())
    new = {edge: how for edge, how in upward.items() if edge not in KNOWN_EXCEPTIONS}
    assert not new, f"imports up the layers (tests/test_layout.py's table): {new}"
    gone = sorted(set(KNOWN_EXCEPTIONS) - set(upward))
    assert not gone, f"known exceptions that no longer occur, delete them from KNOWN_EXCEPTIONS: {gone}"


def test_an_upward_import_is_found(tmp_path):
    """A core module that imports the edge breaks the table (else the check above could not fail)."""
    pkg = tmp_path / "sidecar"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "units.py").write_text("def f():\n    from .daemon import serve\n")
    (pkg / "daemon.py").write_text("from . import units\n")
    assert upward_imports(import_graph(pkg)) == {("units", "daemon"): "core -> edge"}


def test_the_docstring_shows_the_table():
    """The module's docstring lists every entry of :data:`LAYERS` under its layer, in the table's order."""
    assert __doc__ is not None
    rows = __doc__.split("    layer     may import", 1)[1].split("\n\n", 1)[0]
    shown: dict[str, str] = {}
    name = ""
    for line in rows.splitlines()[1:]:
        if line[4:5].strip():  # a new row: its layer's name in the first column
            name = line.split()[0]
        shown[name] = shown.get(name, "") + ", " + line[41:]
    assert list(shown) == [n for n, _ in LAYERS]
    for layer, entries in LAYERS:
        words = shown[layer].replace(";", ",").replace("old names:", "").replace("old name:", "")
        listed = [w.strip() for w in words.split(",")]
        listed = [w.split(" ")[0] for w in listed if w]
        assert sorted(listed) == sorted(entries), layer


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
