"""``type: ignore`` stays rare and explained: a code, a reason on the same line, at most ten in the tree.

mypy checks the four packages, their tests and the benchmarks (``make lint``, ``make test``) and flags an
ignore that is no longer needed; this test keeps each one explained, and their number small.
"""

from __future__ import annotations

import os
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_IGNORES = 10
EXPLAINED = re.compile(r"type:\s*ignore\[[a-z0-9-]+(,\s*[a-z0-9-]+)*\]\s+#\s*\S.{5,}")


def _ignores() -> list[tuple[str, int, str]]:
    """(path, line, comment) of every ``type: ignore`` comment in the project's Python files."""
    found = []
    for path in _python_files():
        relative = path.relative_to(ROOT)
        with tokenize.open(path) as source:
            for token in tokenize.generate_tokens(source.readline):
                if token.type == tokenize.COMMENT and re.search(r"type:\s*ignore", token.string):
                    found.append((str(relative), token.start[0], token.string))
    return found


BUILT = {"node_modules", "build", "dist"}
"""Directories of installed or built copies (npm's, a wheel's build), not the project's own files."""


def _python_files() -> Iterator[Path]:
    """The project's Python files: hidden directories (virtual environments, caches) and built copies left
    out."""
    for directory, subdirectories, files in os.walk(ROOT):
        subdirectories[:] = sorted(d for d in subdirectories if not d.startswith(".") and d not in BUILT)
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(directory, name)


def test_every_type_ignore_names_its_code_and_says_why():
    unexplained = [
        f"{path}:{line}: {comment}" for path, line, comment in _ignores() if not EXPLAINED.search(comment)
    ]
    assert unexplained == []


def test_at_most_ten_type_ignores_in_the_tree():
    ignores = _ignores()
    assert 0 < len(ignores) <= MAX_IGNORES, [f"{path}:{line}" for path, line, _ in ignores]


def test_the_rule_tells_an_explained_ignore_from_a_bare_one():
    assert EXPLAINED.search("# type: ignore[override]  # Spark passes back a partition made above")
    assert not EXPLAINED.search("# type: ignore[override]")
    assert not EXPLAINED.search("# type: ignore  # no code")
