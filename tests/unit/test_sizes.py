"""The broker stays in pieces a reader can hold: no class of ``broker_edge`` over 40 methods, no module over
800 lines. A piece that must be larger is listed below with its reason; a listed piece that has shrunk under
the bound must leave the list, so the list only ever says what is true.

Methods are what a class body defines with ``def`` (properties and static methods included); lines are the
file's lines, docstrings and comments included.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "broker_edge"
MAX_METHODS = 40
MAX_LINES = 800

LARGE_MODULES: dict[str, str] = {}
"""Modules allowed over ``MAX_LINES``, each with why."""

LARGE_CLASSES: dict[str, str] = {}
"""Classes (``path:Name``) allowed over ``MAX_METHODS``, each with why."""


def module_lines(root: Path) -> dict[str, int]:
    """``path`` -> its number of lines, for every module under ``root``."""
    return {
        path.relative_to(root.parent).as_posix(): len(path.read_text().splitlines())
        for path in sorted(root.rglob("*.py"))
    }


def class_methods(root: Path) -> dict[str, int]:
    """``path:Class`` -> the number of methods its body defines, for every class under ``root``."""
    counts: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                methods = [
                    item for item in node.body if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
                counts[f"{relative}:{node.name}"] = len(methods)
    return counts


def test_no_module_is_over_the_bound_unless_listed() -> None:
    over = {path: lines for path, lines in module_lines(PACKAGE).items() if lines > MAX_LINES}
    assert sorted(set(over) - set(LARGE_MODULES)) == []


def test_no_class_is_over_the_bound_unless_listed() -> None:
    over = {name: methods for name, methods in class_methods(PACKAGE).items() if methods > MAX_METHODS}
    assert sorted(set(over) - set(LARGE_CLASSES)) == []


def test_every_exception_is_still_needed() -> None:
    lines = module_lines(PACKAGE)
    methods = class_methods(PACKAGE)
    assert sorted(path for path in LARGE_MODULES if lines.get(path, 0) <= MAX_LINES) == []
    assert sorted(name for name in LARGE_CLASSES if methods.get(name, 0) <= MAX_METHODS) == []


def test_the_counts_read_real_code(tmp_path: Path) -> None:
    """The counting itself, on a small tree: a checker that read nothing would pass the real one too."""
    package = tmp_path / "pkg"
    package.mkdir()
    body = "".join(f"    def m{number}(self) -> None:\n        pass\n" for number in range(41))
    (package / "big.py").write_text(f"class Big:\n{body}\n\nclass Small:\n    def only(self) -> None: ...\n")
    assert class_methods(package) == {"pkg/big.py:Big": 41, "pkg/big.py:Small": 1}
    assert module_lines(package) == {"pkg/big.py": 87}
