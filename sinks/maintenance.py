"""Table maintenance: what keeps a table written every second fast to read and bounded on disk.

Every micro-batch adds a data file (or one per partition) and a log entry to each table it writes; merges
also leave the files they replaced on disk. Three operations undo that, each one per table, through the
:class:`~sinks.store.TableStore` (delta-rs here, native Delta where the session has it):

- **compaction** bin-packs the small files of each partition into files of up to the target size (a
  commit that changes no rows: appends, readers, change feeds and the batch markers are untouched);
- **vacuum** deletes the files no snapshot of the retention period references (what compaction and merges
  replaced, and files of writes that never committed);
- **log tidying** checkpoints the Delta log and deletes the entries older than the log retention.

The retention periods are also set on each table (``delta.deletedFileRetentionDuration``,
``delta.logRetentionDuration``), so that any other engine maintaining it honours the same ones. An
operation that fails on one table is recorded and the others go on: maintenance never loses rows, so the
next pass simply tries again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from sinks.store import DELETED_FILE_RETENTION, LOG_RETENTION, TableStore, retention_interval

log = logging.getLogger(__name__)

__all__ = ["DELETED_FILE_RETENTION", "LOG_RETENTION", "RetentionPolicy", "Upkeep", "maintenance_pass"]


@dataclass(frozen=True)
class RetentionPolicy:
    """How tables are kept: the size compaction aims for, and how long removed files and log entries stay."""

    target_bytes: int = 16 << 20
    #: a partition is compacted once it holds this many files under ``target_bytes``
    min_files: int = 10
    #: removed data files stay this long (readers of older snapshots, lagging change feeds, time travel)
    retention_hours: float = 168.0
    #: log entries stay this long (time travel and history go back this far)
    log_retention_hours: float = 48.0
    #: a clustered table's file of one value is packed with others once it was not written for this long
    settle_seconds: float = 600.0

    def properties(self) -> dict[str, str]:
        return {
            DELETED_FILE_RETENTION: retention_interval(self.retention_hours),
            LOG_RETENTION: retention_interval(self.log_retention_hours),
        }


@dataclass
class Upkeep:
    """What one operation did to one table (counts are None when the backend does not report them)."""

    table: str
    operation: str
    count: int | None = None
    seconds: float = 0.0
    error: str | None = None


def compact_tables(store: TableStore, names: Iterable[str], policy: RetentionPolicy) -> list[Upkeep]:
    """Compact each table's crowded partitions; ``count`` is the files removed."""
    return [
        _run(
            "compact",
            partial(store.compact, settle_s=policy.settle_seconds),
            name,
            policy.target_bytes,
            policy.min_files,
        )
        for name in names
    ]


def apply_retention(store: TableStore, names: Iterable[str], policy: RetentionPolicy) -> list[Upkeep]:
    """Set the policy's retention properties on each table where they differ; ``count`` 1 if it changed."""
    return [_run("retention", store.set_properties, name, policy.properties()) for name in names]


def vacuum_tables(store: TableStore, names: Iterable[str], policy: RetentionPolicy) -> list[Upkeep]:
    """Vacuum each table, then tidy its log; ``count`` is the files, then the log entries, deleted."""
    done = []
    for name in names:
        done.append(_run("vacuum", store.vacuum, name, policy.retention_hours))
        done.append(_run("tidy_log", store.tidy_log, name))
    return done


def maintenance_pass(
    store: TableStore,
    names: Iterable[str],
    policy: RetentionPolicy,
    *,
    retention: bool = True,
    compact: bool = True,
    vacuum: bool = True,
) -> list[Upkeep]:
    """One pass over ``names``, in order: the retention properties, compaction, then vacuum and logs."""
    names = list(names)
    done = apply_retention(store, names, policy) if retention else []
    if compact:
        done += compact_tables(store, names, policy)
    if vacuum:
        done += vacuum_tables(store, names, policy)
    return done


def _run(operation: str, work: Callable[..., int | bool | None], name: str, *args: Any) -> Upkeep:
    """``work(name, *args)``, timed; a failure is logged and recorded, not raised."""
    began = time.perf_counter()
    try:
        result = work(name, *args)
        count = int(result) if result is not None else None
    except Exception as exc:  # the rows are all there; the next pass tries again
        why = _first_line(exc)
        log.warning("%s of %s failed: %s", operation, name, why)
        log.debug("%s of %s failed", operation, name, exc_info=True)
        return Upkeep(name, operation, None, time.perf_counter() - began, f"{type(exc).__name__}: {why}")
    upkeep = Upkeep(name, operation, count, time.perf_counter() - began)
    log.debug("%s", upkeep)
    return upkeep


def _first_line(exc: Exception) -> str:
    """The error's message up to its first line break (delta-rs appends a Rust backtrace when
    ``RUST_BACKTRACE`` is set): one line per table and operation."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else repr(exc)
