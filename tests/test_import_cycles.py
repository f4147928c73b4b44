"""No import cycle among tdag's modules, function-local imports included.

The module graph has an edge a -> b for every ``import b`` / ``from ... import`` in a, at any
depth (a lazy import inside a function hides a cycle, it does not break it). ``from pkg
import name`` imports the module ``pkg.name`` when there is one, else ``pkg``; a module's
parent package is not counted as imported (Python runs its ``__init__`` first, but the
package's __init__ gathering its own modules is not a cycle of ideas).
"""
from __future__ import annotations

import ast
import pathlib

import networkx as nx

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tdag"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute name of ``from <node.module> import ...`` written in ``module``."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[:len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imported(module: str, path: pathlib.Path, modules: dict) -> set[str]:
    """The tdag modules that ``module`` imports, at any depth."""
    out: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, module, is_package)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.add(sub if sub in modules else source)
    return {name for name in out if name in modules}


def module_graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        graph.add_edges_from((module, target) for target in _imported(module, path, modules))
    return graph


def test_the_graph_sees_lazy_and_relative_imports():
    graph = module_graph()
    assert graph.number_of_nodes() > 100
    assert graph.has_edge("tdag.ops.trace", "tdag.ops.builder")


def test_no_import_cycle():
    graph = module_graph()
    loops = sorted(a for a, b in nx.selfloop_edges(graph))
    assert not loops, f"modules that import themselves: {loops}"
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, "import cycles:\n" + "\n".join(
        f"  {len(c)} modules: {', '.join(c)}" for c in sorted(cycles, key=len, reverse=True))
