"""docs/architecture.md walks one QoS 1 PUBLISH step by step, each step naming the file and the function that
does it (``path::Name`` or ``path::Class.method``, the path under ``broker_edge/``): every name must be
defined where the walk says, so the walk cannot drift from the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "broker_edge"
REFERENCE = re.compile(r"`([\w/]+\.py)::([\w.]+)`")
STEP = re.compile(r"^\d+\. \*\*")
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def walk_text(text: str) -> str:
    """The walk's section of the document."""
    start = text.index("## One QoS 1 PUBLISH, step by step")
    return text[start : text.index("\n## ", start + 1)]


def steps(section: str) -> list[str]:
    """Each numbered step of the walks, its lines joined."""
    found: list[str] = []
    for line in section.splitlines():
        if STEP.match(line.strip()):
            found.append(line)
        elif found and line.startswith("   "):
            found[-1] += " " + line.strip()
        elif found and not line.strip():
            found.append("")
    return [step for step in found if step]


def defined(root: Path, path: str, name: str) -> bool:
    """Whether ``root/path`` defines ``name`` (a function or class, or ``Class.member``)."""
    file = root / path
    if not file.is_file():
        return False
    scope: list[ast.stmt] = ast.parse(file.read_text()).body
    for part in name.split("."):
        node = next(
            (
                item
                for item in scope
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and item.name == part
            ),
            None,
        )
        if node is None:
            return False
        scope = node.body
    return True


def test_every_step_names_where_it_happens() -> None:
    walked = steps(walk_text(DOC.read_text()))
    assert len(walked) >= 15, "both walks, each of several steps"
    assert [step[:60] for step in walked if not REFERENCE.search(step)] == []


def test_every_name_of_the_walk_is_defined_where_it_says() -> None:
    references = REFERENCE.findall(walk_text(DOC.read_text()))
    assert len(references) >= 40
    assert sorted({f"{path}::{name}" for path, name in references if not defined(PACKAGE, path, name)}) == []


def test_the_check_reads_real_definitions(tmp_path: Path) -> None:
    """The resolver itself, on a small tree: a checker that found everything would pass the real walk too."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "path.py").write_text(
        "class Path:\n    def accept(self):\n        pass\n\n\ndef answer():\n    pass\n"
    )
    assert defined(tmp_path, "engine/path.py", "Path.accept")
    assert defined(tmp_path, "engine/path.py", "answer")
    assert not defined(tmp_path, "engine/path.py", "Path.refuse")
    assert not defined(tmp_path, "engine/other.py", "answer")
