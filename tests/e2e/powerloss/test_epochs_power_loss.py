"""A power cut keeps the leader epochs of every record the saved checkpoint names committed.

A replica copies its leader's epochs into the partition's journal (page cache; an fsync follows in a worker
thread) and commits records once the in-sync replicas hold them; the committed ends are saved periodically.
Were a checkpoint durable before the journal line of its records' epoch, a power cut in between would leave
a replica holding committed records without their epoch: its leader would ask it to cut them, and it would
refuse, out of sync for good. The store syncs every partition's journal before it writes a checkpoint.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from broker_edge.storage import LogStore, StorageConfig
from tests.e2e.powerloss.conftest import LazyMount

RECORD = (b"reading", 1, False, "device", (), None, None, None, None, None)
TOPIC = "site/1/temp"


def _replicated(path: Path) -> LogStore:
    store = LogStore(path, StorageConfig(durability="fsync"))
    store.open()
    store.replicated_log.enable()
    return store


def _open_under(path: Path) -> list[str]:
    """This process's open files under ``path``."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, closed by now
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
    return [name for name in names if name.startswith(f"{path}/")]


def test_a_checkpoint_makes_the_epochs_of_the_records_it_names_committed_durable_first(
    lazy_mount: LazyMount,
) -> None:
    store = _replicated(lazy_mount.path / "data")
    store.append_batch(TOPIC, [RECORD] * 3)
    store.flush()
    partition, topic_id = store.partition_of(TOPIC), store.topic_id(TOPIC)
    journal = store.replicated_log.epoch_journal(partition)
    journal.record(topic_id, [(2, 0)])  # as a follower copies its leader's epoch: not synced yet
    store.replicated_log.commit_to(TOPIC, 3)
    store.replicated_log.checkpoint()
    journal.record(topic_id, [(2, 0), (5, 3)])  # an epoch of no committed record: no checkpoint since
    lazy_mount.cut_power()
    store.close()  # its writes fail and are said; every file on the mount is let go all the same
    assert not _open_under(lazy_mount.path)
    lazy_mount.remount()

    again = _replicated(lazy_mount.path / "data")
    try:
        assert again.committed_end(TOPIC) == 3
        kept = again.replicated_log.epoch_journal(partition).entries(topic_id)
        assert kept == [(2, 0)]  # the committed records' epoch is kept; the unsynced later line is lost
    finally:
        again.close()
