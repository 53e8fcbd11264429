"""Storage settings as plain dataclasses; the broker's YAML loader builds them field by field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Durability = Literal["fsync", "group", "none"]

KIB = 1024
MIB = 1024 * KIB
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
MQTT_MAX_PAYLOAD = 268_435_455


@dataclass(slots=True)
class LogConfig:
    """What one topic's log may keep (the store derives it from `StorageConfig` and the matching rule)."""

    retention_bytes: int | None = None
    """Its oldest records go while the log is larger than this (None: no size limit)."""
    retention_ms: int | None = 7 * DAY_MS
    """Its records go once older than this (None: keep forever)."""


@dataclass(slots=True)
class PersistRule:
    """Which publishes on topics matching `pattern` are written to the log, and how long they are kept.

    Rules are tried in order; the first whose pattern matches a topic decides for it.
    """

    pattern: str
    """MQTT topic filter (`+` and `#` wildcards); `#` matches every topic except `$`-topics."""
    qos: tuple[int, ...] = (1, 2)
    """QoS levels that persist; add 0 to keep QoS 0 traffic too, leave empty to exclude the topics."""
    retention_bytes: int | None = None
    """Overrides `storage.retention_bytes` for these topics; null: `storage.retention_bytes` applies (to keep
    some topics without limit, make `storage.retention_bytes` null and give the other rules theirs)."""
    retention_ms: int | None = None
    """Overrides `storage.retention_ms` for these topics; null: `storage.retention_ms` applies (to keep some
    topics without limit, make `storage.retention_ms` null and give the other rules theirs)."""


@dataclass(slots=True)
class StorageConfig:
    """Settings of a broker's `LogStore`."""

    durability: Durability = "group"
    """`fsync`: write+fsync per append; `group`: one write+fsync per window; `none`: write, no fsync."""
    group_commit_ms: float = 0.0
    """Extra wait of a group-commit window after its first append; appends inside a window share one write
    and one fsync. 0: the window closes with the event-loop iteration that opened it (and, while an fsync
    runs, stays open until it returns, so batches grow with the disk's latency). At most 1000."""
    group_commit_min_interval_ms: float = 0.0
    """Least time from one group-commit job's start to the next's: a window that ends sooner waits until it
    has passed, so that under load fewer fsyncs carry more appends (the CPU of a sync and its two thread
    switches spread over more records); a broker idle for longer cuts at once, one fsync and no wait. 0: no
    least time (a window is cut as soon as it ends). At most 1000."""
    group_commit_max_bytes: int = 4 * MIB
    """Cut a window early once this many bytes are pending, bounding latency and memory."""
    inline_sync_max_bytes: int = 0
    """A window of at most this many bytes, in one file and creating none, cut while the writer thread is
    idle, is fdatasynced on the event loop instead of in the writer thread (no handoff to the thread and
    back, but the loop blocks for the fdatasync). Larger windows, and every window while one is being
    synced, go to the writer thread (the loop keeps accepting appends meanwhile, so batches grow under
    load). 0, the default: every window goes to the writer thread (syncing on the loop costs the persisted
    fan-in throughput, since the loop waits for the disk)."""
    syncfs_min_segments: int = 2
    """A window touching at least this many files (segments of several partitions, their open indexes, the
    catalog) is made durable by one syncfs(2) of the store's filesystem instead of an fdatasync per file
    (Linux >= 5.8, not on FUSE filesystems, where syncfs does not reach the server); 0 turns this off. A
    syncfs also reports another program's lost write on that filesystem (a failed sync stops the store)."""
    persist: list[PersistRule] = field(
        default_factory=lambda: [PersistRule("spBv1.0/#", (0, 1, 2)), PersistRule("#")]
    )
    """Persistence rules, first match wins; a topic no rule matches is not persisted. The default keeps the
    Sparkplug B namespace at every QoS (its edge nodes publish at QoS 0), everything else at QoS 1 and 2."""
    partitions: int = 1
    """Partition logs that topics are spread over (`crc32c(topic) % partitions`, as a cluster places its
    partitions): each holds the records of its topics interleaved in its own segments. One is best for a
    broker alone (a window writes one file); a cluster member, unless set otherwise, stores each cluster
    partition in the storage partition of the same number (`cluster.partitions` of them). An existing topic
    keeps the partition it was created in."""
    segment_bytes: int = 64 * MIB
    """Roll a partition's active segment once it would grow past this size (at most 4 GiB)."""
    segment_ms: int | None = DAY_MS
    """Roll once the active segment's first record is this old, so age retention can reclaim quiet
    partitions (None: roll by size only)."""
    retention_bytes: int | None = None
    """Default size bound per log (a rule may override it)."""
    retention_ms: int | None = 7 * DAY_MS
    """Default age bound per log (a rule may override it)."""
    max_record_bytes: int = MQTT_MAX_PAYLOAD + 64 * KIB
    """Largest encoded record accepted (its body: a 21-byte header, the publisher's client id, the packet id
    of a QoS 2 publish (2 bytes), its MQTT 5 properties and the payload); also the sanity bound on a length
    prefix during recovery. At least 24 + `limits.max_client_id_length` (152 by default): a 1-byte QoS 2
    payload from the longest client id accepted."""
    max_topics: int = 1_000_000
    """Most logs one broker keeps; appending to a new topic beyond it raises `TooManyTopics` (counted, and
    logged once per `refusal_log_interval_s`)."""
    refusal_log_interval_s: float = 60.0
    """Appends refused at `max_topics` are logged at most once per this many seconds, with their count."""
    max_open_files: int = 1024
    """Segment and index file descriptors kept open (LRU); the rest are reopened on demand."""
    tail_cache_records: int = 1024
    """No longer used (there is no per-topic tail cache: see `tail_cache_total_bytes`); accepted so that
    existing configurations keep loading."""
    tail_cache_bytes: int = 1 * MIB
    """No longer used (see `tail_cache_records`)."""
    tail_cache_total_bytes: int = 8 * MIB
    """Bytes of the windows written last kept in memory for caught-up readers (shared by every topic, the
    oldest dropped first); 0 = off."""
    read_cache_bytes: int = 8 * MIB
    """Bound of the memory of the blocks of records read once and shared by every reader of the same range
    (frames, payloads and their Python objects); 0 = off."""
    sealed_cache_bytes: int = 4 * MIB
    """Bytes of blocks of topic groups read from sealed indexes kept in memory (least recently used go)."""
    index_checkpoint_bytes: int = 4 * MIB
    """The active segment's index is checkpointed to its open index every this many bytes of records, so a
    crash rescans at most about this much of each partition."""
    disk_reserve_bytes: int = 1 * MIB
    """Disk space held in a preallocated file (`log/disk-reserve`) for the topic table snapshot that lets
    retention delete segments when the disk is full: at least this much, and half as much again as the
    snapshot. 0 keeps none (a disk the log filled then needs space freed by hand before segments go)."""

    def log_config(self, rule: PersistRule | None) -> LogConfig:
        """The retention of a log whose topic matched `rule` (None: store defaults)."""
        retention_bytes = self.retention_bytes
        retention_ms = self.retention_ms
        if rule is not None:
            if rule.retention_bytes is not None:
                retention_bytes = rule.retention_bytes
            if rule.retention_ms is not None:
                retention_ms = rule.retention_ms
        return LogConfig(retention_bytes=retention_bytes, retention_ms=retention_ms)
