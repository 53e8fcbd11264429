"""Durable per-topic commitlogs of an edge broker (see docs/commitlog.md).

`frame_runs` (columnar reads, numpy) is left out here: it is loaded by the first columnar read.
"""

from .commitlog import CommitLog, LogRecovery, RetentionResult
from .config import Durability, LogConfig, PersistRule, StorageConfig
from .errors import (
    CorruptRecord,
    InvalidRecord,
    OffsetOutOfRange,
    RecordTooLarge,
    StorageError,
    StorageFailed,
    TooManyTopics,
    UnknownTopic,
)
from .record import AppendRecord, Record
from .store import LogInfo, LogStore, RecoveryReport, RetentionReport

__all__ = [
    "AppendRecord",
    "CommitLog",
    "CorruptRecord",
    "Durability",
    "InvalidRecord",
    "LogConfig",
    "LogInfo",
    "LogRecovery",
    "LogStore",
    "OffsetOutOfRange",
    "PersistRule",
    "Record",
    "RecordTooLarge",
    "RecoveryReport",
    "RetentionReport",
    "RetentionResult",
    "StorageConfig",
    "StorageError",
    "StorageFailed",
    "TooManyTopics",
    "UnknownTopic",
]
