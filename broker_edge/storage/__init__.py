"""Durable per-topic commitlogs of an edge broker, stored in partition logs (see docs/commitlog.md).

`frame_runs` (columnar reads, numpy) is left out here: it is loaded by the first columnar read.
"""

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
from .partition_reads import PositionOutOfRange
from .quarantine import LogQuarantined, QuarantinedLog
from .record import AppendRecord, Record
from .retention import RetentionReport
from .store import LogInfo, LogStore, PartitionInfo, PartitionRecords, RecoveryReport

__all__ = [
    "AppendRecord",
    "CorruptRecord",
    "Durability",
    "InvalidRecord",
    "LogConfig",
    "LogInfo",
    "LogQuarantined",
    "LogStore",
    "OffsetOutOfRange",
    "PartitionInfo",
    "PartitionRecords",
    "PersistRule",
    "PositionOutOfRange",
    "QuarantinedLog",
    "Record",
    "RecordTooLarge",
    "RecoveryReport",
    "RetentionReport",
    "StorageConfig",
    "StorageError",
    "StorageFailed",
    "TooManyTopics",
    "UnknownTopic",
]
