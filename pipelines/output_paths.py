"""Where a pipeline writes (a tables root, a checkpoint) and with what (the table backend), checked before
Spark starts; and that a checkpoint it resumes from reads as Spark wrote it.

A local path that is a file, or lies under one, or under a directory this process cannot write, would
otherwise fail inside the first micro-batch as a Java or delta-rs stack. Object-store URIs (``s3://``,
``abfss://``, ``dbfs:/``...) are left to the store that opens them: whether they are writable is only
known by writing.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from broker_edge.config.loader import TOO_DEEP, ConfigError

__all__ = [
    "NotWritable",
    "check_backend",
    "check_checkpoint",
    "check_input_location",
    "check_output_location",
    "check_table_root",
    "check_tables_writable",
    "file_system_failure",
]

_OS_ERROR = re.compile(r"([^:\n\u21b3]*\(os error \d+\))")
"""The file system's reason in a delta-rs error (``... Unable to copy data to file: No space left on device
(os error 28)``)."""
_RUST_OS_ERROR = re.compile(r'Os \{ code: \d+, kind: \w+, message: "([^"]+)" \}')
"""The same, where delta-rs gives it as Rust's error (``Os { code: 2, kind: NotFound, message: "..." }``)."""


class NotWritable(ConfigError):
    """A local location this process may not write (no write permission, a read-only file system): for a
    command whose line is right, a failure of where it writes rather than of what it was told."""


def check_backend(backend: str, key: str) -> None:
    """Raise ConfigError naming ``key`` when ``backend`` is ``native`` and this process has no Spark Delta:
    the store would fail at its first table, once Spark started (a Databricks task's line, run elsewhere)."""
    from sinks.backends import native_backend_missing

    problem = native_backend_missing() if backend == "native" else None
    if problem is not None:
        raise ConfigError(key, problem)


def check_output_location(location: str, key: str) -> None:
    """Raise ConfigError naming ``key`` when a local ``location`` cannot be a directory written here
    (:class:`NotWritable` when it could be, but this process may not write it)."""
    path = _local_directory(location, key)
    if path is None:
        return
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(key, f"{location!r} cannot be created: {str(existing)!r} is a file")
    _check_writable(location, key, existing)


def check_tables_writable(location: str, tables: Iterable[str], key: str) -> None:
    """Raise :class:`NotWritable` naming ``key`` when a local table of ``tables`` under ``location`` exists
    and this process may not write its folder or its ``_delta_log``: delta-rs would fail in the middle of
    the write, after a Rust panic on the standard error."""
    path = _local_directory(location, key)
    if path is None:
        return
    for table in tables:
        for folder in (path / table, path / table / "_delta_log"):
            if folder.is_dir():
                _check_writable(location, key, folder)


def _check_writable(location: str, key: str, folder: Path) -> None:
    """:class:`NotWritable` naming ``key`` when this process may not write ``folder`` (of ``location``)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        raise NotWritable(key, f"{location!r} cannot be written: no write permission on {str(folder)!r}")


def check_checkpoint(
    location: str, key: str, guide: str = 'docs/telemetry-pipeline.md, "Exactly once"'
) -> None:
    """Raise ConfigError naming ``key`` and the file when a local streaming checkpoint holds a damaged file
    that Spark reads to resume (its ``metadata``, the newest two ``offsets`` and the newest ``commits``):
    Spark would fail the query on it with a parse error naming no file, and every restart the same way.
    ``guide``: where the docs say what a new checkpoint means for this job."""
    path = _local_directory(location, key)
    if path is None or not path.is_dir():
        return
    wanted = [path / "metadata", *_newest(path / "offsets", 2), *_newest(path / "commits", 1)]
    for file in wanted:
        why = _damage(file, offsets=file.parent.name == "offsets") if file.is_file() else None
        if why is not None:
            raise ConfigError(
                key,
                f"{file} is damaged ({why}): the query cannot resume from it; restore the file, or start a "
                f"new checkpoint ({guide})",
            )


def _newest(directory: Path, count: int) -> list[Path]:
    """The ``count`` newest batch files of a checkpoint log (named by their batch id; ``.crc`` and temporary
    files are not batches)."""
    if not directory.is_dir():
        return []
    batches = [entry for entry in directory.iterdir() if entry.name.isdigit()]
    return sorted(batches, key=lambda entry: int(entry.name))[-count:]


def _damage(file: Path, *, offsets: bool) -> str | None:
    """What makes a checkpoint file unreadable to Spark; None when it reads."""
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        return f"unreadable: {error}"
    if not lines:
        return "empty"
    if file.name == "metadata":
        try:
            document = json.loads(lines[0])
        except (ValueError, RecursionError) as error:
            return f"line 1 is not JSON: {_json_error(error)}"
        return None if isinstance(document, dict) and isinstance(document.get("id"), str) else "no query id"
    if not re.fullmatch(r"v[1-9][0-9]*", lines[0]):
        return f"line 1 is {lines[0][:40]!r}, not a version such as v1"
    if len(lines) < (3 if offsets else 2):
        return "no offsets after its metadata line" if offsets else "no line after its version"
    for number, line in enumerate(lines[1:] if offsets else lines[1:2], start=2):
        try:
            if line != "-":  # a source without an offset yet
                json.loads(line)
        except (ValueError, RecursionError) as error:
            return f"line {number} is not JSON: {_json_error(error)}"
    return None


def _json_error(error: Exception) -> str:
    """Why a line is not JSON: the parser's error, or that it nests past what the parser follows."""
    return TOO_DEEP if isinstance(error, RecursionError) else str(error)


def check_table_root(location: str, key: str) -> None:
    """Raise ConfigError naming ``key`` when delta-rs would not find the tables of ``location`` there: a '%'
    and two hex digits in a local root, which it reads as a URL escape (``sinks.object_store.check_root``)."""
    from sinks.object_store import check_root  # (pyarrow: only where a table root is checked)

    try:
        check_root(location)
    except ValueError as error:
        raise ConfigError(key, str(error)) from None


def check_input_location(location: str, key: str) -> None:
    """Raise ConfigError naming ``key`` when a local ``location`` that is read is a file: tables under it
    would read as none at all."""
    _local_directory(location, key)


def _local_directory(location: str, key: str) -> Path | None:
    """``location`` as a local path (None: an object store's URI), refused when empty or a file."""
    if not location.strip():
        raise ConfigError(key, "must not be empty")
    if location.startswith("file://"):
        location = location.removeprefix("file://")
    elif "://" in location or location.startswith("dbfs:"):
        return None
    path = Path(location).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise ConfigError(key, f"{location!r} is a file, not a directory")
    return path


def file_system_failure(error: Exception) -> str | None:
    """The file system's reason, in one line, when a table store's read or write failed for one (a full disk,
    a read-only or vanished directory: an ``OSError``, or delta-rs's error ending in ``(os error N)``); None
    for any other failure, which is not the operator's to fix."""
    if isinstance(error, BrokenPipeError):  # the reader of the command's output went away (``| head``)
        return None
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # less its colours
    found = _OS_ERROR.findall(text) or _RUST_OS_ERROR.findall(text)
    if found:
        return found[-1].strip()
    if isinstance(error, OSError):
        return error.strerror or str(error).splitlines()[0]
    return None
