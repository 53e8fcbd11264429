"""Other commits of this repository, for the benches that measure one beside this checkout (``--against``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def short_commit(rev: str, repository: Path = REPO, timeout_s: float | None = None) -> str:
    """``rev``'s abbreviated commit id."""
    return subprocess.run(
        ["git", "-C", str(repository), "rev-parse", "--short", rev],
        check=True,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    ).stdout.strip()


def tree_of(rev: str, into: Path, *paths: str, repository: Path = REPO) -> Path:
    """``into``, holding commit ``rev``'s files (only ``paths`` where given), nothing of the worktree's
    state: ``git archive``, unpacked."""
    archive = subprocess.run(
        ["git", "-C", str(repository), "archive", rev, *paths], check=True, capture_output=True
    ).stdout
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into
