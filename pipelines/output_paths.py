"""Where a pipeline writes (a tables root, a checkpoint) and with what (the table backend), checked before
Spark starts.

A local path that is a file, or lies under one, or under a directory this process cannot write, would
otherwise fail inside the first micro-batch as a Java or delta-rs stack. Object-store URIs (``s3://``,
``abfss://``, ``dbfs:/``...) are left to the store that opens them: whether they are writable is only
known by writing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from broker_edge.config.loader import ConfigError

__all__ = ["check_backend", "check_input_location", "check_output_location", "file_system_failure"]

_OS_ERROR = re.compile(r"([^:\n\u21b3]*\(os error \d+\))")
"""The file system's reason in a delta-rs error (``... Unable to copy data to file: No space left on device
(os error 28)``)."""
_RUST_OS_ERROR = re.compile(r'Os \{ code: \d+, kind: \w+, message: "([^"]+)" \}')
"""The same, where delta-rs gives it as Rust's error (``Os { code: 2, kind: NotFound, message: "..." }``)."""


def check_backend(backend: str, key: str) -> None:
    """Raise ConfigError naming ``key`` when ``backend`` is ``native`` and this process has no Spark Delta:
    the store would fail at its first table, once Spark started (a Databricks task's line, run elsewhere)."""
    from sinks.backends import native_backend_missing

    problem = native_backend_missing() if backend == "native" else None
    if problem is not None:
        raise ConfigError(key, problem)


def check_output_location(location: str, key: str) -> None:
    """Raise ConfigError naming ``key`` when a local ``location`` cannot be a directory written here."""
    path = _local_directory(location, key)
    if path is None:
        return
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(key, f"{location!r} cannot be created: {str(existing)!r} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(key, f"{location!r} cannot be written: no write permission on {str(existing)!r}")


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
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # less its colours
    found = _OS_ERROR.findall(text) or _RUST_OS_ERROR.findall(text)
    if found:
        return found[-1].strip()
    if isinstance(error, OSError):
        return error.strerror or str(error).splitlines()[0]
    return None
