"""The modules of ``broker_edge`` import each other without a cycle: each can be read (and loaded) alone.

The graph is read from the source: every import executed when a module is loaded (module level, outside
``if TYPE_CHECKING:``), with the implicit import of each parent package, since ``import a.b.c`` runs
``a/__init__.py`` and ``a/b/__init__.py`` first. Imports inside functions are deferred on purpose (optional
or heavy parts) and are listed separately: they must not close a cycle either.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = "broker_edge"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module, module: str, is_package: bool, deferred: bool) -> set[str]:
    """Modules named by the imports at module level (``deferred``: those inside functions instead)."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt], in_function: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node):
                visit(node.orelse, in_function)
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(node.body, True)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)) and in_function == deferred:
                found.update(_targets(node, module, is_package))
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list) and children and isinstance(children[0], ast.AST):
                    visit([c for c in children if isinstance(c, ast.stmt)], in_function)
                    for handler in children:
                        if isinstance(handler, ast.ExceptHandler):
                            visit(handler.body, in_function)

    visit(tree.body, False)
    return found


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return {base} | {f"{base}.{alias.name}" for alias in node.names}


def _graph(deferred: bool) -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = _imports(ast.parse(path.read_text()), name, path.name == "__init__.py", deferred)
        edges: set[str] = set()
        for target in targets:
            parts = target.split(".")
            for end in range(1, len(parts) + 1):  # the parent packages run first
                candidate = ".".join(parts[:end])
                if candidate in modules and candidate != name and not name.startswith(candidate + "."):
                    edges.add(candidate)
        graph[name] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_modules_load_without_an_import_cycle():
    cycle = _cycle(_graph(deferred=False))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_deferred_imports_close_no_cycle_either():
    graph = _graph(deferred=False)
    for name, targets in _graph(deferred=True).items():
        graph[name] = graph[name] | targets
    cycle = _cycle(graph)
    assert cycle is None, "import cycle through a function-level import: " + " -> ".join(cycle or [])


def test_the_graph_reader_sees_a_cycle_when_there_is_one():
    """The checks above could pass by reading nothing: a known cycle must be found."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    graph = _graph(deferred=False)
    assert "broker_edge.engine.publish" in graph["broker_edge.engine.core"]
    assert "broker_edge.engine.handlers" in graph["broker_edge.engine.connection.connection"]
    assert "broker_edge.storage" in graph["broker_edge.engine.publish"]  # via broker_edge.storage.errors


@pytest.mark.parametrize(
    "module", ["broker_edge.engine.handlers.connect", "broker_edge.engine.handlers.publish"]
)
def test_handlers_do_not_load_the_connection(module):
    """Handlers see the connection only as a type: ``connection`` imports them, never the reverse."""
    assert "broker_edge.engine.connection.connection" not in _graph(deferred=False)[module]
