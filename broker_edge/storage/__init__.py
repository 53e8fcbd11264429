"""Durable per-topic commitlogs of an edge broker (see docs/commitlog.md)."""

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
from .frame_runs import FrameRun
from .record import AppendRecord, Record
from .store import LogInfo, LogStore, RecoveryReport, RetentionReport

__all__ = [
    "AppendRecord",
    "CommitLog",
    "CorruptRecord",
    "Durability",
    "FrameRun",
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
