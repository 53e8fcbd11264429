"""The upgrade of a layout-2 directory (a directory per topic) into partition logs, and its resumption.

Every topic keeps the same records at the same offsets, byte for byte (what a replica of it holds), its
start offset (retention had moved it), its damaged records (never served) and its leader epochs; the
broker's files stay; the old directories go. A start interrupted anywhere (in the middle of the copy, at
the switch, in the deletion of the old directories) finishes the upgrade the next time, with no record lost
or copied twice.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest

from broker_edge.storage import CorruptRecord, LogStore, OffsetOutOfRange, StorageConfig, UnknownTopic
from broker_edge.storage.epoch_journal import EpochJournal
from broker_edge.storage.layout import layout_version
from broker_edge.storage.record import encode_record
from tests.unit.broker_edge.storage.layout2 import SESSIONS, write_layout_2
from tests.unit.broker_edge.storage.log_helpers import assert_matches, flip_byte, make_record

LONG = "plant/" + "very-long-level/" * 20 + "temp"
TOPICS = {
    "plant/1/temp": [make_record(n) for n in range(11)],
    "plant/2/temp": [make_record(n) for n in range(3)],
    "moved/start": [make_record(n) for n in range(5)],
    "damaged/record": [make_record(n) for n in range(6)],
    "empty": [],
    LONG: [make_record(n) for n in range(2)],
}
STARTS = {"moved/start": 40, "empty": 7}
EPOCHS = {"plant/1/temp": [(1, 0), (3, 6)]}


def _layout_2(root: Path) -> dict[str, list[bytes]]:
    frames = write_layout_2(root, TOPICS, segment_records=4, starts=STARTS, epochs=EPOCHS)
    damaged_segment = root / "topics" / "damaged%2Frecord" / f"{0:020d}.log"
    flip_byte(damaged_segment, len(frames["damaged/record"][0]) + 40)  # record 1: its CRC fails
    frames["damaged/record"][1] = damaged_segment.read_bytes()[len(frames["damaged/record"][0]) :][
        : len(frames["damaged/record"][1])
    ]
    (root / "topics" / "lost+found").mkdir()
    return frames


def _stored_frames(store: LogStore, topic: str) -> list[bytes]:
    frames: list[bytes] = []
    offset, end = store.start_offset(topic), store.durable_end(topic)
    while offset < end:
        batch, count = store.replicated_log.read_frames(topic, offset, 1 << 20)
        if not count:  # a damaged record stops a read: the next one goes on after it
            batch, count = store.replicated_log.read_frames(topic, offset, 1 << 20, stop=offset + 1)
        frames += [bytes(frame) for frame in batch]
        offset += max(count, 1)
    return frames


def assert_upgraded(root: Path, frames: dict[str, list[bytes]]) -> None:
    store = LogStore(root, StorageConfig(partitions=2))
    store.open()
    try:
        assert layout_version(root) == "3"
        assert sorted(path.name for path in root.iterdir()) == ["log", "meta", "topics"]
        assert [path.name for path in (root / "topics").iterdir()] == ["lost+found"]  # not a topic: left
        assert (root / "meta" / "sessions.json").read_text() == SESSIONS
        assert sorted(info.topic for info in store.logs()) == sorted(TOPICS)
        for topic, records in TOPICS.items():
            start = STARTS.get(topic, 0)
            info = store.log_info(topic)
            assert (info.start_offset, info.end_offset) == (start, start + len(records)), topic
            if topic != "damaged/record":
                assert _stored_frames(store, topic) == frames[topic], topic  # byte for byte
                for number, record in enumerate(store.read(topic, start, 100)):
                    assert_matches(record, number, offset=start + number)
        with pytest.raises(OffsetOutOfRange):
            store.read("moved/start", 39)
        damaged = store.read("damaged/record", 0, 100)
        assert [record.offset for record in damaged] == [0]  # a read stops before the damaged record
        with pytest.raises(CorruptRecord) as caught:
            store.read("damaged/record", 1)
        assert caught.value.next_offset == 2
        assert [record.offset for record in store.read("damaged/record", 2, 100)] == [2, 3, 4, 5]
        journal = EpochJournal(store.replicated_log.epochs_path(store.partition_of("plant/1/temp")))
        assert journal.entries(store.topic_id("plant/1/temp")) == EPOCHS["plant/1/temp"]
        assert store.append("plant/2/temp", make_record(3)) == 3
        assert store.append("empty", make_record(0)) == 7
        store.flush()
        assert_matches(store.read("plant/2/temp", 3)[0], 3)
    finally:
        store.close()


def test_a_layout_2_directory_is_upgraded_keeping_every_record_byte_for_byte(tmp_path: Path):
    frames = _layout_2(tmp_path)

    assert_upgraded(tmp_path, frames)


@pytest.mark.parametrize("copies_before_the_crash", [0, 1, 3, 5])
def test_an_upgrade_interrupted_in_the_middle_of_the_copy_goes_on_where_it_stopped(
    tmp_path: Path, monkeypatch, copies_before_the_crash: int
):
    frames = _layout_2(tmp_path)
    real = LogStore.import_frames
    done: list[str] = []

    def crashing(store, topic, *args):
        if len(done) == copies_before_the_crash:
            raise OSError("power cut")
        done.append(topic)
        return real(store, topic, *args)

    monkeypatch.setattr(LogStore, "import_frames", crashing)
    with contextlib.suppress(OSError):
        LogStore(tmp_path, StorageConfig(partitions=2)).open()
    monkeypatch.setattr(LogStore, "import_frames", real)

    assert layout_version(tmp_path) == "2"  # nothing switched: the old directories are still the truth
    assert_upgraded(tmp_path, frames)


def test_an_upgrade_interrupted_at_the_switch_or_while_deleting_is_finished(tmp_path: Path, monkeypatch):
    frames = _layout_2(tmp_path)
    real_rmtree = shutil.rmtree
    calls: list[str] = []

    def crashing_rmtree(path, *args, **kwargs):
        calls.append(str(path))
        if "/topics/" in str(path) and len([c for c in calls if "/topics/" in c]) == 2:
            raise OSError("power cut")
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", crashing_rmtree)
    with contextlib.suppress(OSError):
        LogStore(tmp_path, StorageConfig(partitions=2)).open()
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)

    assert layout_version(tmp_path) == "3"  # switched: what is left is the deletion
    assert_upgraded(tmp_path, frames)


@pytest.mark.parametrize(
    "damage",
    ["unreadable segment", "segment past the ceiling", "record past the ceiling"],
)
def test_a_layout_2_log_that_cannot_be_copied_is_set_aside_and_every_other_log_upgraded(
    tmp_path: Path, damage: str
):
    """No topic's files stop a start: a layout-2 log whose segment cannot be read (EIO, a directory in its
    place) or that holds offsets no log holds (what a hub before the ceiling wrote) is set aside, its
    directory kept out of the way for inspection, and every other log is upgraded."""
    frames = write_layout_2(
        tmp_path, {"good/1": [make_record(n) for n in range(6)], "bad/2": [make_record(1)]}
    )
    bad = tmp_path / "topics" / "bad%2F2"
    if damage == "unreadable segment":
        (bad / f"{0:020d}.log").unlink()
        (bad / f"{0:020d}.log").mkdir()
    elif damage == "segment past the ceiling":
        (bad / f"{0:020d}.log").rename(bad / f"{2**63 - 1:020d}.log")
    else:
        (bad / f"{2**60:020d}.log").write_bytes(encode_record(2**60, 0, make_record(2)))

    store = LogStore(tmp_path, StorageConfig())
    report = store.open()

    assert _stored_frames(store, "good/1") == frames["good/1"]
    assert [q.topic for q in report.quarantined] == ["bad/2"]
    with pytest.raises(UnknownTopic):
        store.read("bad/2", 0)
    kept = tmp_path / "topics.not-copied" / "bad%2F2"
    assert kept.is_dir()
    assert layout_version(str(tmp_path)) == "3"
    store.close()
    again = LogStore(tmp_path, StorageConfig())
    assert [q.topic for q in again.open().quarantined] == ["bad/2"]
    assert _stored_frames(again, "good/1") == frames["good/1"]
    again.close()


def test_a_layout_2_leader_epochs_file_that_cannot_be_read_leaves_its_log_copied(tmp_path: Path):
    frames = write_layout_2(tmp_path, {"replica/1": [make_record(n) for n in range(3)]})
    (tmp_path / "topics" / "replica%2F1" / "leader-epochs").write_bytes(b"\xff\xfe damaged")

    store = LogStore(tmp_path, StorageConfig())
    report = store.open()

    assert report.quarantined == []
    assert _stored_frames(store, "replica/1") == frames["replica/1"]
    store.close()
