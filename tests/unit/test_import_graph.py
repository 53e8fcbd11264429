"""The import rules of ``broker_edge``, ``sources``, ``sinks`` and ``pipelines`` (docs/architecture.md).

Every import counts: at module level, under ``if TYPE_CHECKING:`` and inside functions, with the implicit
import of each parent package (``import a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first). A
type-level circle is still a circle: no file of it can be read, or checked, alone. Three rules:

- no circle of any kind;
- the layers are ordered (``LAYERS``, top first): a module imports its own folder and the layers below,
  never a layer above nor another folder of its own layer;
- nothing of the engine imports the cluster: the cluster enters the engine through ``engine/ports.py``.

The rules are checked on the real tree, and the checks themselves on small trees written here, which break
each rule once (a checker that reads nothing would pass the real tree too).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker_edge", "sources", "sinks", "pipelines")

LAYERS: tuple[tuple[str, ...], ...] = (
    ("pipelines",),
    ("sources",),
    ("sinks",),
    ("broker_edge.runtime",),
    ("broker_edge.pki",),
    ("broker_edge.cluster", "broker_edge.uplink"),
    ("broker_edge.offsets_api",),
    ("broker_edge.http",),
    ("broker_edge.engine",),
    ("broker_edge.settings",),
    ("broker_edge.security", "broker_edge.storage", "broker_edge.process"),
    ("broker_edge.observe",),
    ("broker_edge.config", "broker_edge.protocol", "broker_edge.log_info", "broker_edge.placement"),
    ("broker_edge.bounds",),
    ("broker_edge",),
)
"""The parts of the four packages, top layer first; a part is a folder (or a module) and what it holds."""

ENGINE = "broker_edge.engine"
CLUSTER = "broker_edge.cluster"

Graph = dict[str, set[str]]


# -- reading the graph ---------------------------------------------------------------------------------------


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> set[str]:
    """What an import statement names: its module and, for ``from m import x``, ``m.x`` (a module or not)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return {base} | {f"{base}.{alias.name}" for alias in node.names}


def read_graph(root: Path, packages: Iterable[str]) -> Graph:
    """Module → the modules of ``packages`` it imports, every import statement of its file counted."""
    paths = {
        module_name(root, path): path
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
    }
    graph: Graph = {}
    for name, path in paths.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                targets |= _targets(node, name, path.name == "__init__.py")
        edges: set[str] = set()
        for target in targets:
            parts = target.split(".")
            for end in range(1, len(parts) + 1):  # the parent packages run first
                candidate = ".".join(parts[:end])
                if candidate in paths and candidate != name and not name.startswith(candidate + "."):
                    edges.add(candidate)
        graph[name] = edges
    return graph


# -- the rules -----------------------------------------------------------------------------------------------


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Every circle of ``graph``: its strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def part_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> tuple[int, str] | None:
    """``(layer number, part)`` of ``module``: the longest part that holds it (None: none does)."""
    best: tuple[int, str] | None = None
    for number, parts in enumerate(layers):
        for part in parts:
            if (module == part or module.startswith(part + ".")) and (
                best is None or len(part) > len(best[1])
            ):
                best = (number, part)
    return best


def inversions(graph: Mapping[str, set[str]], layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """Imports of a layer above, or of another part of the same layer (``a -> b``)."""
    found = []
    for source, targets in sorted(graph.items()):
        mine = part_of(source, layers)
        for target in sorted(targets):
            theirs = part_of(target, layers)
            if mine is None or theirs is None or mine[1] == theirs[1]:
                continue
            if theirs[0] <= mine[0]:
                found.append(f"{source} -> {target}")
    return found


def engine_to_cluster(graph: Mapping[str, set[str]]) -> list[str]:
    """Imports of the cluster by the engine (``a -> b``)."""
    return [
        f"{source} -> {target}"
        for source, targets in sorted(graph.items())
        if source == ENGINE or source.startswith(ENGINE + ".")
        for target in sorted(targets)
        if target == CLUSTER or target.startswith(CLUSTER + ".")
    ]


# -- the real tree -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> Graph:
    return read_graph(ROOT, PACKAGES)


def test_no_circle_of_any_kind(graph: Graph) -> None:
    assert circles(graph) == []


def test_every_import_points_down_the_layers(graph: Graph) -> None:
    assert inversions(graph) == []


def test_the_engine_imports_nothing_of_the_cluster(graph: Graph) -> None:
    assert engine_to_cluster(graph) == []


def test_every_module_belongs_to_a_layer(graph: Graph) -> None:
    assert [module for module in graph if part_of(module) is None] == []


def test_the_graph_is_read_whole(graph: Graph) -> None:
    """The checks above pass on a graph that holds the imports they are about."""
    assert "broker_edge.engine.ports" in graph["broker_edge.engine.core"]  # module level
    assert "broker_edge.engine.handlers" in graph["broker_edge.engine.connection.connection"]
    assert "broker_edge.engine.sessions.session" in graph["broker_edge.engine.ports"]  # TYPE_CHECKING only
    assert "broker_edge.cluster.node" in graph["broker_edge.runtime.broker"]  # inside a function
    assert "broker_edge.storage" in graph["broker_edge.engine.publish"]  # via broker_edge.storage.errors
    assert "broker_edge.engine.ports" in graph["broker_edge.cluster.node"]


@pytest.mark.parametrize("handler", ["connect", "publish", "subscribe"])
def test_handlers_see_the_connection_as_a_client_they_declare(graph: Graph, handler: str) -> None:
    """``connection`` imports the handlers; they name it only as ``handlers.context.Client``."""
    module = f"broker_edge.engine.handlers.{handler}"
    assert "broker_edge.engine.connection.connection" not in graph[module]
    assert "broker_edge.engine.handlers.context" in graph[module]


# -- the checks, on small trees that break each rule once ----------------------------------------------------


def _tree(root: Path, files: Mapping[str, str]) -> Graph:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return read_graph(root, sorted({name.split("/")[0] for name in files}))


TYPE_ONLY = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from {0} import X\n"
IN_FUNCTION = "def f():\n    from {0} import X\n"


def test_a_circle_through_a_type_only_import_is_found(tmp_path: Path) -> None:
    graph = _tree(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/a.py": "from app.b import X\n",
            "app/b.py": TYPE_ONLY.format("app.a"),
            "app/c.py": "import app.a\n",
        },
    )
    assert circles(graph) == [["app.a", "app.b"]]


def test_a_circle_through_an_import_inside_a_function_or_a_relative_one_is_found(tmp_path: Path) -> None:
    graph = _tree(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/x/__init__.py": "",
            "app/x/a.py": IN_FUNCTION.format("app.y.b"),
            "app/y/__init__.py": "",
            "app/y/b.py": "from ..x import a\n",
        },
    )
    assert circles(graph) == [["app.x.a", "app.y.b"]]
    assert circles(_tree(tmp_path / "none", {"app/__init__.py": "", "app/a.py": "import json\n"})) == []


def test_a_circle_through_a_package_face_is_found(tmp_path: Path) -> None:
    """``from app.p.m import X`` runs ``app/p/__init__.py`` first: what that imports is in the circle."""
    graph = _tree(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/p/__init__.py": "from app.p.heavy import Y\n",
            "app/p/m.py": "",
            "app/p/heavy.py": "from app.q import Z\n",
            "app/q.py": TYPE_ONLY.format("app.p.m"),
        },
    )
    assert circles(graph) == [["app.p", "app.p.heavy", "app.q"]]


def test_an_engine_import_of_the_cluster_is_found_type_only_too(tmp_path: Path) -> None:
    graph = _tree(
        tmp_path,
        {
            "broker_edge/__init__.py": "",
            "broker_edge/engine/__init__.py": "",
            "broker_edge/engine/router.py": TYPE_ONLY.format("broker_edge.cluster.shared"),
            "broker_edge/engine/ports.py": "",
            "broker_edge/cluster/__init__.py": "",
            "broker_edge/cluster/shared.py": "from broker_edge.engine.ports import X\n",
        },
    )
    assert engine_to_cluster(graph) == [
        "broker_edge.engine.router -> broker_edge.cluster",
        "broker_edge.engine.router -> broker_edge.cluster.shared",
    ]
    assert circles(graph) == []  # no circle: only the engine rule catches it


def test_a_layer_inversion_and_a_side_step_within_a_layer_are_found(tmp_path: Path) -> None:
    layers = (("top",), ("mid.a", "mid.b"), ("low",))
    graph = _tree(
        tmp_path,
        {
            "top/__init__.py": "import mid.a.one\n",  # down: allowed
            "mid/__init__.py": "",
            "mid/a/__init__.py": "",
            "mid/a/one.py": "import low\nfrom mid.a import two\n",  # down, and its own part: allowed
            "mid/a/two.py": IN_FUNCTION.format("mid.b.three"),  # another part of its layer
            "mid/b/__init__.py": "",
            "mid/b/three.py": "",
            "low/__init__.py": TYPE_ONLY.format("top"),  # up
        },
    )
    assert inversions(graph, layers) == [
        "low -> top",
        "mid.a.two -> mid.b",
        "mid.a.two -> mid.b.three",
    ]
