"""Files of a cleanly stopped broker lost or cut before its restart, as an operator or a disk loses them: a
segment file deleted from the middle, the last sealed segment cut at an entry boundary, the catalog deleted.

The broker (its own process) takes QoS 1 publishes on two topics with small segments and is stopped with
SIGTERM (every segment sealed, the topic table snapshot written). After the damage it starts again: the
offsets API serves every record still on disk with its offset and payload, answers 500 `corrupt_record`
(missing) for the lost ones, the log says what was lost at ERROR, and a new publish gets an offset above
every offset given before. Without its catalog the broker does not start, in one line naming the file.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_edge.offsets_api.client import CorruptRecordError, OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient
from tests.e2e.commitlog.e2e_helpers import health
from tests.unit.broker_edge.storage.log_helpers import entry_positions, partition_segments

COUNT = 120
TOPICS = ["lost/a", "lost/b"]
STORAGE = {"segment_bytes": 4096}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A broker directory after COUNT acknowledged publishes per topic and a clean stop."""
    directory = tmp_path_factory.mktemp("pristine")
    broker = BrokerProcess(directory, storage=STORAGE, limits={"messages_per_second_per_client": 0}).start()
    publisher = PahoClient(broker.port, "writer")
    for number in range(COUNT):
        for topic in TOPICS:
            publisher.publish(topic, f"{topic} {number:04d}", 1)
    publisher.close()
    broker.stop()
    return directory


@pytest.fixture
def copy(stopped: Path, tmp_path: Path) -> Iterator[Path]:
    target = tmp_path / "broker"
    shutil.copytree(stopped, target)
    (target / "broker.log").unlink(missing_ok=True)
    yield target


def _served(client: OffsetsClient, topic: str) -> dict[int, bytes]:
    """Every record of `topic` the API serves, stepping over the offsets it answers are missing."""
    served: dict[int, bytes] = {}
    offset, end = 0, client.log_info(topic).end_offset
    while offset < end:
        try:
            rows = client.fetch(topic, offset, max_records=1000).data.to_pylist()
        except CorruptRecordError as error:
            assert error.status == 500
            offset = error.next_offset
            continue
        served.update((row["offset"], row["payload"]) for row in rows)
        offset = rows[-1]["offset"] + 1
    return served


def _expected(topic: str, offsets) -> dict[int, bytes]:
    return {offset: f"{topic} {offset:04d}".encode() for offset in offsets}


def _offsets_in(segments: list[Path], number: int, topic_id: int) -> range:
    first = sum(len(entry_positions(path, topic_id)) for path in segments[:number])
    return range(first, first + len(entry_positions(segments[number], topic_id)))


def test_a_deleted_middle_segment_loses_only_its_records(copy: Path):
    segments = partition_segments(copy / "data")
    lost = {topic: _offsets_in(segments, 1, topic_id) for topic_id, topic in enumerate(TOPICS)}
    segments[1].unlink()

    broker = BrokerProcess(copy, storage=STORAGE).start()
    try:
        PahoClient(broker.port, "after").publish(TOPICS[0], "after the damage", 1)
        with OffsetsClient(broker.offsets_url) as client:
            for topic in TOPICS:
                kept = [offset for offset in range(COUNT) if offset not in lost[topic]]
                served = _served(client, topic)
                if topic == TOPICS[0]:
                    assert served.pop(COUNT) == b"after the damage"
                assert served == _expected(topic, kept)
                with pytest.raises(CorruptRecordError) as caught:
                    client.fetch(topic, lost[topic][0])
                assert caught.value.next_offset == lost[topic].stop
        report = health(broker)
        assert report["status"] == "ok"
        assert report["records_lost_at_open"] == sum(len(offsets) for offsets in lost.values())
    finally:
        broker.stop()
    text = broker.log_path.read_text()
    records = sum(len(offsets) for offsets in lost.values())
    assert f"ERROR broker_edge.storage.recovery: {segments[1]} is missing (its sealed index is there)" in text
    assert f"{records} records of 2 logs are lost" in text
    assert f"1 repaired, {records} records lost" in text


def test_the_last_sealed_segment_cut_at_an_entry_boundary_keeps_its_offsets(copy: Path):
    segments = partition_segments(copy / "data")
    last = segments[-1]
    positions = entry_positions(last)
    size = last.stat().st_size
    os.truncate(last, positions[-6])  # six whole entries gone
    kept = {
        topic: _offsets_in(segments, len(segments) - 1, topic_id).start
        + sum(1 for position in entry_positions(last, topic_id))
        for topic_id, topic in enumerate(TOPICS)
    }

    broker = BrokerProcess(copy, storage=STORAGE).start()
    try:
        with OffsetsClient(broker.offsets_url) as client:
            for topic in TOPICS:
                assert client.log_info(topic).end_offset == COUNT
                assert _served(client, topic) == _expected(topic, range(kept[topic]))
            PahoClient(broker.port, "after").publish(TOPICS[0], "after the damage", 1)
            rows = client.fetch(TOPICS[0], COUNT).data.to_pylist()
            assert [(row["offset"], row["payload"]) for row in rows] == [(COUNT, b"after the damage")]
            with pytest.raises(CorruptRecordError):
                client.fetch(TOPICS[0], COUNT - 1)  # lost, never given again
    finally:
        broker.stop()
    text = broker.log_path.read_text()
    assert f"{last} is {size - positions[-6]} bytes shorter than its sealed index says" in text
    assert "6 records at the end of 2 logs are lost" in text


def test_a_deleted_catalog_stops_the_start_in_one_line(copy: Path):
    catalog = copy / "data" / "log" / "catalog"
    catalog.unlink()

    broker = BrokerProcess(copy, storage=STORAGE)
    with pytest.raises(RuntimeError, match="broker did not start"):
        broker.start(timeout_s=15)
    text = broker.log_path.read_text()
    assert f"ERROR broker_edge.main: cannot start: {catalog} is missing, but " in text
    assert "Traceback" not in text
    assert not catalog.exists()
