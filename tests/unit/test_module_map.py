"""docs/architecture.md's module map lists every module of the four packages, and nothing that is gone.

A row names a package (or continues the one above, its first cell empty) and, in backticks, its modules. A
package's ``__init__`` is a module of the map when it holds more than its docstring.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("broker_edge", "sources", "sinks", "pipelines")
ROW = re.compile(r"^\| (`[\w.]+`)? *\| ([^|]+) \|")
NAME = re.compile(r"`([\w.]+)`")


def listed(text: str) -> set[str]:
    """``package.module`` of every module the map's table names."""
    names: set[str] = set()
    inside = False
    package = ""
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line.strip() == "## Module map"
            continue
        match = ROW.match(line) if inside else None
        if match is None:
            continue
        if match.group(1):
            package = match.group(1).strip("`")
        names |= {f"{package}.{module}" for module in NAME.findall(match.group(2))}
    return names


def holds_code(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return bool(body)


def modules(root: Path) -> set[str]:
    """``package.module`` of every module of the four packages (``__init__`` when it holds code)."""
    found: set[str] = set()
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            if path.name == "__init__.py" and not holds_code(path):
                continue
            parts = path.relative_to(root).with_suffix("").parts
            found.add(".".join(parts[:-1]) + "." + parts[-1])
    return found


def test_every_module_is_in_the_map() -> None:
    assert sorted(modules(ROOT) - listed(DOC.read_text())) == []


def test_the_map_names_no_module_that_is_gone() -> None:
    assert sorted(listed(DOC.read_text()) - modules(ROOT)) == []


def test_the_map_is_read_row_by_row(tmp_path: Path) -> None:
    """A table the reader gets wrong would make both checks above pass or fail for nothing."""
    text = "\n".join(
        [
            "## Module map",
            "| package | modules | job |",
            "|---|---|---|",
            "| `app` | `a`, `b` | two jobs, `not_a_module` is in the job column |",
            "| | `__init__` | the package's face |",
            "| `app.sub` | `c` | one |",
            "## Next section",
            "| `app` | `z` | not in the map |",
        ]
    )
    assert listed(text) == {"app.a", "app.b", "app.__init__", "app.sub.c"}
    (tmp_path / "app" / "sub").mkdir(parents=True)
    (tmp_path / "app" / "__init__.py").write_text('"""Only a docstring."""\n')
    (tmp_path / "app" / "sub" / "__init__.py").write_text("from app.sub.c import X\n")
    (tmp_path / "app" / "sub" / "c.py").write_text("X = 1\n")
    assert holds_code(tmp_path / "app" / "sub" / "__init__.py")
    assert not holds_code(tmp_path / "app" / "__init__.py")
