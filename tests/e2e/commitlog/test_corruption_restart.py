"""Damaged log files found by a real broker restart: repaired as specified, and only valid records served.

The broker (its own process) takes QoS 1 publishes on four topics, interleaved in its partition log, and is
killed with SIGKILL (so the active segment was never sealed, and its open index checkpoints nothing: see
`storage.index_checkpoint_bytes`). The files are then damaged the ways disks and crashes damage them: a torn
last entry, a flipped byte in a sealed segment, a flipped byte in the middle of the active segment, and a
sealed segment's index deleted. After the restart the offsets API serves every valid record with its
original offset and payload, answers 500 `corrupt_record` (with where to resume) for a damaged one, appends
continue densely, and a device replaying over MQTT 5 gets every valid record.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_edge.offsets_api.client import CorruptRecordError, OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient
from tests.e2e.commitlog.e2e_helpers import offset_of, read_log, replay_from
from tests.unit.broker_edge.storage.log_helpers import entry_positions, flip_byte, partition_segments

COUNT = 150
TOPICS = ["rot/flip-sealed", "rot/flip-active", "rot/no-index", "rot/torn"]
"""Created (and published to) in this order: topic ids 0 to 3; `rot/torn`'s record is the last written."""


def _payloads(rows: list[dict]) -> dict[int, bytes]:
    return {row["offset"]: row["payload"] for row in rows}


def _expected(offsets) -> dict[int, bytes]:
    return {offset: f"record {offset:04d}".encode() for offset in offsets}


def _offset_of_entry(segments: list[Path], segment: Path, position_in_topic: int, topic_id: int) -> int:
    """The offset of a topic's `position_in_topic`-th entry in `segment` (its earlier segments first)."""
    before = sum(len(entry_positions(path, topic_id)) for path in segments[: segments.index(segment)])
    return before + position_in_topic


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> Iterator[dict[str, Any]]:
    """A broker restarted over damaged files; what each damage was, and what the API serves now."""
    directory = tmp_path_factory.mktemp("damaged")
    broker = BrokerProcess(
        directory,
        storage={"segment_bytes": 4096, "index_checkpoint_bytes": 1 << 30},
        limits={"messages_per_second_per_client": 0},
    ).start()
    publisher = PahoClient(broker.port, "writer")
    for offset in range(COUNT):
        for topic in TOPICS:
            publisher.publish(topic, f"record {offset:04d}", 1)
    publisher.close()
    broker.kill()

    data = broker.directory / "data"
    segments = partition_segments(data)
    active = segments[-1]
    torn_topic = int.from_bytes(active.read_bytes()[entry_positions(active)[-1] :][:4], "little")
    os.truncate(active, entry_positions(active)[-1] + 11)  # the last entry torn
    sealed = segments[1]
    sealed_damaged = _offset_of_entry(segments, sealed, 2, 0)
    flip_byte(sealed, entry_positions(sealed, 0)[2] + 8 + 30)
    active_positions = entry_positions(active, 1)
    active_damaged = _offset_of_entry(segments, active, len(active_positions) // 2, 1)
    flip_byte(active, active_positions[len(active_positions) // 2] + 8 + 30)
    partition_segments(data, suffix=".index")[2].unlink()  # rebuilt from its data

    broker.start()
    result: dict[str, Any] = {
        "broker": broker,
        "torn_topic": TOPICS[torn_topic],
        "sealed_damaged": sealed_damaged,
        "active_damaged": active_damaged,
        "rows": {},
        "infos": {},
    }
    try:
        with OffsetsClient(broker.offsets_url) as client:
            for topic in TOPICS:
                result["infos"][topic] = client.log_info(topic)
            result["rows"]["rot/torn"] = read_log(client, "rot/torn")  # before the append after restart
            result["rows"]["rot/no-index"] = read_log(client, "rot/no-index")
        yield result
    finally:
        broker.stop()


def test_a_torn_last_entry_is_cut_and_appends_continue_densely(damaged):
    broker = damaged["broker"]
    torn = damaged["torn_topic"]  # the topic whose record was written last
    infos = damaged["infos"]

    assert torn == TOPICS[-1]
    assert infos[torn].end_offset == COUNT - 1
    assert all(infos[topic].end_offset == COUNT for topic in TOPICS if topic != torn)
    PahoClient(broker.port, "after").publish(torn, "record after restart", 1)
    with OffsetsClient(broker.offsets_url) as client:
        last = client.fetch(torn, COUNT - 1).data.to_pylist()
    assert [(row["offset"], row["payload"]) for row in last] == [(COUNT - 1, b"record after restart")]


def test_the_records_of_the_torn_topic_before_the_tear_are_all_served(damaged):
    assert _payloads(damaged["rows"]["rot/torn"]) == _expected(range(COUNT - 1))


@pytest.mark.parametrize("topic", ["rot/flip-sealed", "rot/flip-active"])
def test_a_flipped_byte_makes_only_that_record_unreadable(damaged, topic):
    bad = damaged["sealed_damaged"] if topic == "rot/flip-sealed" else damaged["active_damaged"]

    with OffsetsClient(damaged["broker"].offsets_url) as client:
        before = client.fetch(topic, 0, max_records=COUNT).data.to_pylist()
        with pytest.raises(CorruptRecordError) as caught:
            client.fetch(topic, bad)
        after = client.fetch(topic, caught.value.next_offset, max_records=COUNT).data.to_pylist()

    assert damaged["infos"][topic].end_offset == COUNT  # nothing valid was cut away
    assert (caught.value.status, caught.value.offset, caught.value.next_offset) == (500, bad, bad + 1)
    assert _payloads(before) == _expected(range(bad))  # a read stops before the damage
    assert _payloads(after) == _expected(range(bad + 1, COUNT))


def test_a_sealed_index_that_is_gone_is_rebuilt_and_every_record_served(damaged):
    assert _payloads(damaged["rows"]["rot/no-index"]) == _expected(range(COUNT))


def test_the_broker_logs_what_recovery_repaired_with_counts(damaged):
    text = damaged["broker"].log_path.read_text()

    assert "after an unclean shutdown" in text
    assert "(torn): dropped 11 bytes" in text
    assert f"records [{damaged['active_damaged']}] failed their checksum" in text
    assert "1 indexes rebuilt" in text


def test_a_device_replaying_over_the_damage_gets_every_valid_record(damaged):
    device = PahoClient(damaged["broker"].port, "replayer")
    device.subscribe("rot/flip-sealed", 1, properties=replay_from("earliest"))

    got = device.expect(COUNT - 1)

    bad = damaged["sealed_damaged"]
    assert [offset_of(message) for message in got] == [o for o in range(COUNT) if o != bad]
    assert {offset_of(m): m.payload for m in got} == _expected(o for o in range(COUNT) if o != bad)
    device.expect_none()
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{damaged['broker'].admin_port}/metrics").read()
    assert b'timestone_broker_messages_dropped_total{reason="log_corrupt"} 1.0' in metrics
