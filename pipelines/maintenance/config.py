"""The ``maintenance`` section both jobs' configurations share (``telemetry.tables.maintenance`` in
``conf/pipeline.yaml``, ``maintenance`` in ``conf/actions.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker_edge.config.loader import ConfigError
from sinks.maintenance import RetentionPolicy

if TYPE_CHECKING:
    from sinks.store import TableStore

#: Shorter retentions could delete the files of a write still running (or a read of a moment ago).
MIN_RETENTION_HOURS = 1 / 60
MAX_RETENTION_HOURS = 876_000
"""A hundred years: delta-rs keeps a retention in a duration of milliseconds (it panicked past its bound)."""

#: Spark keeps this many batches of a streaming query's offsets and commits in its checkpoint.
MIN_BATCHES_TO_RETAIN_CONF = "spark.sql.streaming.minBatchesToRetain"


@dataclass
class MaintenanceConfig:
    """When a job compacts, vacuums and tidies the tables it writes, and what it keeps."""

    enabled: bool = True
    """False: the job leaves its tables alone (``timestone tables maintain`` or another engine does it)."""
    compact_interval_s: float = 60.0
    """Seconds between two compactions of every table the job writes (in the background)."""
    target_file_mb: int = 16
    """Compaction writes files of up to this size and leaves larger ones alone."""
    min_files: int = 10
    """A partition is compacted once it holds this many files under the target size."""
    vacuum_interval_s: float = 3600.0
    """Seconds between two vacuums (and log checkpoints and clean-ups) of every table the job writes."""
    retention_hours: float = 168.0
    """Files compaction or merges replaced are deleted this long after (readers of older snapshots,
    lagging change feeds and time travel need them until then); at least ``log_retention_hours``."""
    log_retention_hours: float = 48.0
    """Delta log entries are kept this long (history and time travel go back this far)."""
    settle_s: float = 600.0
    """A clustered table (``action_executions``, by action) keeps the rows of one action in a file of their
    own until they were not written for this long, then packs them with others'."""
    checkpoint_batches: int = 100
    """Batches a streaming checkpoint keeps the offsets and commits of (Spark's minBatchesToRetain)."""

    def __post_init__(self) -> None:
        for name in ("compact_interval_s", "vacuum_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, "must be positive")
        for name in ("target_file_mb", "checkpoint_batches"):
            if getattr(self, name) < 1:
                raise ConfigError(name, "must be at least 1")
        for name in ("retention_hours", "log_retention_hours"):
            if getattr(self, name) < MIN_RETENTION_HOURS:
                raise ConfigError(name, f"must be at least {MIN_RETENTION_HOURS:.4f} (a minute)")
            if not getattr(self, name) <= MAX_RETENTION_HOURS:  # nan too
                raise ConfigError(name, f"must be at most {MAX_RETENTION_HOURS} (a hundred years)")
        if self.retention_hours < self.log_retention_hours:  # a version the log holds must stay readable
            raise ConfigError(
                "retention_hours",
                f"must be at least log_retention_hours ({self.log_retention_hours:g}): time travel and "
                "change feeds reach every version the log keeps, and need its files",
            )
        if self.settle_s < 0:
            raise ConfigError("settle_s", "must be at least 0")
        if self.min_files < 2:
            raise ConfigError("min_files", "must be at least 2 (one file is already compact)")

    def policy(self) -> RetentionPolicy:
        return RetentionPolicy(
            self.target_file_mb << 20,
            self.min_files,
            self.retention_hours,
            self.log_retention_hours,
            self.settle_s,
        )


@dataclass(frozen=True)
class MaintenanceTarget:
    """A pipeline's tables as maintenance sees them: where, which, and how (each job's
    ``maintenance_target``, what ``timestone tables maintain`` maintains)."""

    store: TableStore
    tables: tuple[str, ...]
    config: MaintenanceConfig
