"""What Linux's ``/proc`` tells of processes: for tests of what a command starts and leaves running."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first, then the parent's id)."""
    return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()


def children_of(parents: Iterable[int]) -> list[int]:
    """Every process whose parent is one of ``parents``."""
    wanted = set(parents)
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int(_stat_fields(entry.name)[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent in wanted:
            found.append(int(entry.name))
    return found


def command_line(pid: int) -> str:
    """The command line of ``pid``, its arguments joined by spaces ("" once it is gone)."""
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def state(pid: int) -> str:
    """The state letter of ``pid`` (``R``, ``S``, ``T`` stopped, ``Z`` zombie...; "" once it is gone)."""
    try:
        return _stat_fields(pid)[0]
    except (OSError, IndexError):
        return ""


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie)."""
    return state(pid) not in ("", "Z")
