"""A replicated store saves its logs' committed ends, and a restart shows no record beyond them."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage.hw_checkpoint import CHECKPOINT_FILE, read_checkpoint

RECORD = (b"reading", 1, False, "device", (), None, None, None, None, None)


def _commit_and_wait_for_a_periodic_checkpoint(tmp_path: Path) -> None:
    """A replicated store checkpointing every 50 ms commits 3 records of ``t``; returns once a periodic
    checkpoint saved that (fails after 5 s)."""

    async def scenario() -> None:
        store = _store(tmp_path)
        store.replicated_log.enable(checkpoint_interval_s=0.05)
        store.append_batch("t", [RECORD] * 3)
        await store.wait_durable()
        store.replicated_log.commit_to("t", 3)
        path = store.layout.meta_file(CHECKPOINT_FILE)
        deadline = asyncio.get_running_loop().time() + 5
        while read_checkpoint(path) != {"t": 3}:
            assert asyncio.get_running_loop().time() < deadline, "no checkpoint written"
            await asyncio.sleep(0.01)
        store.close()

    asyncio.run(scenario())


def _store(path: Path) -> LogStore:
    store = LogStore(path, StorageConfig(durability="fsync"))
    store.open()
    return store


def _five_committed(path: Path) -> LogStore:
    """A replicated store whose log ``t`` holds 5 records, all committed (no checkpoint says so yet)."""
    store = _store(path)
    store.replicated_log.enable()
    store.append_batch("t", [RECORD] * 5)
    store.flush()
    store.replicated_log.commit_to("t", 5)
    return store


def _payloads(store: LogStore, topic: str) -> int:
    """How many records readers of `topic` see."""
    return len(store.read(topic, 0, 1000, 1 << 20))


def test_a_restarted_replica_starts_committed_where_it_was_not_where_its_log_ends(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.replicated_log.enable()
    store.append_batch("t", [RECORD] * 5)
    store.flush()
    store.replicated_log.commit_to("t", 3)  # two records durable here, not yet held by every in-sync replica
    store.close()

    again = _store(tmp_path)
    again.replicated_log.enable()
    assert again.durable_end("t") == 5
    assert again.committed_end("t") == 3
    assert _payloads(again, "t") == 3  # the uncommitted tail stays invisible
    assert again.replicated_log.commit_to("t", 5) == 5  # until the leader's watermark passes it
    again.close()


def test_a_crash_shows_at_most_the_last_checkpoint_and_a_log_it_does_not_list_shows_nothing(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    store.replicated_log.enable()
    store.append_batch("t", [RECORD] * 4)
    store.flush()
    store.replicated_log.commit_to("t", 2)
    store.replicated_log.checkpoint()  # what the periodic checkpoint saves
    store.replicated_log.commit_to("t", 4)
    store.append_batch("u", [RECORD] * 2)  # a log created since
    store.flush()
    store.replicated_log.commit_to("u", 2)
    # the process dies here: no close, no newer checkpoint

    again = _store(tmp_path)
    again.replicated_log.enable()
    assert (again.committed_end("t"), again.durable_end("t")) == (2, 4)
    assert (again.committed_end("u"), again.durable_end("u")) == (0, 2)
    again.close()
    store.close()


def test_the_checkpoint_is_written_periodically_while_the_loop_runs(tmp_path: Path) -> None:
    _commit_and_wait_for_a_periodic_checkpoint(tmp_path)


def test_a_store_never_replicated_starts_with_everything_committed(tmp_path: Path) -> None:
    alone = _store(tmp_path)
    alone.append_batch("t", [RECORD] * 3)  # acknowledged by a broker running alone
    alone.close()

    member = _store(tmp_path)
    member.replicated_log.enable()
    assert member.committed_end("t") == 3
    member.close()
    assert read_checkpoint(member.layout.meta_file(CHECKPOINT_FILE)) == {"t": 3}


@pytest.mark.parametrize(
    "damaged",
    [b'{"version": 1, "committed": {"t": -4}}', b'\xff\xfe{"version": 1}', b"\x00" * 64],
    ids=["a negative end", "not UTF-8 (until 2026-12-01 a UnicodeDecodeError stopped the start)", "zeroed"],
)
def test_a_damaged_checkpoint_starts_every_log_committed_at_its_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damaged: bytes
) -> None:
    store = _store(tmp_path)
    store.replicated_log.enable()
    store.append_batch("t", [RECORD] * 3)
    store.flush()
    store.replicated_log.commit_to("t", 3)
    store.close()
    Path(store.layout.meta_file(CHECKPOINT_FILE)).write_bytes(damaged)

    with caplog.at_level(logging.ERROR):
        again = _store(tmp_path)
        again.replicated_log.enable()
    assert again.committed_end("t") == 0 and again.durable_end("t") == 3  # nothing lost, nothing shown
    assert any("replication-offset-checkpoint is damaged" in r.getMessage() for r in caplog.records)
    again.close()
    other = _store(tmp_path / "other")
    with pytest.raises(ValueError, match="checkpoint_interval_s"):
        other.replicated_log.enable(checkpoint_interval_s=0)
    other.close()


def test_truncating_below_the_committed_end_saves_the_lower_end_at_once(tmp_path: Path) -> None:
    store = _five_committed(tmp_path)
    store.replicated_log.checkpoint()
    store.replicated_log.truncate_to(
        "t", 3
    )  # only after an unclean election does a replica lose committed records
    assert read_checkpoint(store.layout.meta_file(CHECKPOINT_FILE)) == {"t": 3}
    store.close()


def test_the_periodic_checkpoint_is_written_off_the_loop_thread(tmp_path: Path, monkeypatch) -> None:
    import threading

    from broker_edge.storage import replicated_log as store_module

    writers: list[threading.Thread] = []
    real = store_module.write_checkpoint

    def spying(path: str, committed: dict[str, int]) -> None:
        writers.append(threading.current_thread())
        real(path, committed)

    monkeypatch.setattr(store_module, "write_checkpoint", spying)

    _commit_and_wait_for_a_periodic_checkpoint(tmp_path)

    assert writers[0] is threading.main_thread()  # enabling replication writes the first one at once
    assert writers[1] is not threading.main_thread()


def test_an_earlier_checkpoint_never_replaces_a_later_one(tmp_path: Path) -> None:
    store = _five_committed(tmp_path)
    earlier = store.replicated_log._take_checkpoint()  # taken for a periodic write that has not run yet
    assert earlier is not None
    store.replicated_log.truncate_to("t", 3)  # saves {"t": 3} at once
    store.replicated_log._write_checkpoint(*earlier)  # the periodic write runs late: skipped
    assert read_checkpoint(store.layout.meta_file(CHECKPOINT_FILE)) == {"t": 3}
    store.close()


def test_a_checkpoint_that_failed_is_written_at_the_next_one_though_no_end_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A truncation saves the lower end at once; if that write fails (a full disk), the file still says the
    higher end, which a restart would show records past: the next checkpoint writes it, ends moved or not."""
    from broker_edge.storage import replicated_log as store_module

    store = _five_committed(tmp_path)
    store.replicated_log.checkpoint()
    real = store_module.write_checkpoint

    def full_disk(path: str, committed: dict[str, int]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_module, "write_checkpoint", full_disk)
    store.replicated_log.truncate_to("t", 3)
    path = store.layout.meta_file(CHECKPOINT_FILE)
    assert read_checkpoint(path) == {"t": 5}

    monkeypatch.setattr(store_module, "write_checkpoint", real)
    store.replicated_log.checkpoint()  # what the periodic tick does: nothing moved since the truncation
    assert read_checkpoint(path) == {"t": 3}
    store.close()


def test_no_checkpoint_is_written_while_an_epoch_journal_cannot_be_synced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint names records committed; their leader epochs must be durable first, or a crash could
    leave a replica holding committed records without their epoch (its leader would tell it to cut them)."""
    store = _five_committed(tmp_path)
    store.replicated_log.checkpoint()
    path = store.layout.meta_file(CHECKPOINT_FILE)
    journal = store.replicated_log.epoch_journal(store.partition_of("t"))
    journal.record(store.topic_id("t"), [(1, 0), (2, 5)])  # a new leader's epoch, then its records
    store.append_batch("t", [RECORD] * 2)
    store.flush()
    store.replicated_log.commit_to("t", 7)
    Path(journal.path).unlink()  # the journal cannot be opened to be synced: an I/O failure

    with caplog.at_level(logging.ERROR):
        store.replicated_log.checkpoint()
    assert read_checkpoint(path) == {"t": 5}
    assert f"while {journal.path} cannot be synced" in caplog.text

    journal.record(store.topic_id("t"), [(1, 0), (2, 5)])  # written again: it can be synced
    store.replicated_log.checkpoint()  # what the periodic tick does: nothing moved since
    assert read_checkpoint(path) == {"t": 7}
    store.close()
