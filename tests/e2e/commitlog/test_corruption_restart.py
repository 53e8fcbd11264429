"""Damaged log files found by a real broker restart: repaired as specified, and only valid records served.

The broker (its own process) takes QoS 1 publishes on four topics, is killed with SIGKILL (so the active
segments' indexes were never written), and the files are then damaged the ways disks and crashes damage
them: a torn last record, a flipped byte in a sealed segment, a flipped byte in the middle of the active
segment, an index left in the "open" state. After the restart the offsets API serves every valid record
with its original offset and payload, answers 500 `corrupt_record` (with where to resume) for a damaged
one, appends continue densely, and a device replaying over MQTT 5 gets every valid record.
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
from broker_edge.storage.topic_names import topic_directory_name
from tests.e2e.broker_clients import PahoClient
from tests.e2e.commitlog.e2e_helpers import offset_of, read_log, replay_from
from tests.unit.broker_edge.storage.log_helpers import flip_byte, frame_positions, segment_files

COUNT = 150
TOPICS = ["rot/torn", "rot/flip-sealed", "rot/flip-active", "rot/open-index"]


def _segments(broker: BrokerProcess, topic: str, suffix: str = ".log") -> list[Path]:
    return segment_files(broker.directory / "data" / "topics" / topic_directory_name(topic), suffix)


def _payloads(rows: list[dict]) -> dict[int, bytes]:
    return {row["offset"]: row["payload"] for row in rows}


def _expected(offsets) -> dict[int, bytes]:
    return {offset: f"record {offset:04d}".encode() for offset in offsets}


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> Iterator[dict[str, Any]]:
    """A broker restarted over damaged files; what each damage was, and what the API serves now."""
    directory = tmp_path_factory.mktemp("damaged")
    broker = BrokerProcess(
        directory,
        storage={"segment_bytes": 2048},
        limits={"messages_per_second_per_client": 0},
    ).start()
    publisher = PahoClient(broker.port, "writer")
    for offset in range(COUNT):
        for topic in TOPICS:
            publisher.publish(topic, f"record {offset:04d}", 1)
    publisher.close()
    broker.kill()

    torn = _segments(broker, "rot/torn")[-1]
    os.truncate(torn, frame_positions(torn)[-1] + 11)
    sealed = _segments(broker, "rot/flip-sealed")[0]
    flip_byte(sealed, frame_positions(sealed)[10] + 30)
    active = _segments(broker, "rot/flip-active")[-1]
    active_base = int(active.stem)
    active_positions = frame_positions(active)
    flip_byte(active, active_positions[len(active_positions) // 2] + 30)
    indexes = _segments(broker, "rot/open-index", ".index")
    assert len(indexes) == len(_segments(broker, "rot/open-index")) - 1  # the active one: never written
    data = bytearray(indexes[1].read_bytes())
    data[6] = 0  # state: open (written but never closed)
    indexes[1].write_bytes(bytes(data))

    broker.start()
    result: dict[str, Any] = {
        "broker": broker,
        "sealed_damaged": 10,
        "active_damaged": active_base + len(active_positions) // 2,
        "rows": {},
        "infos": {},
    }
    try:
        with OffsetsClient(broker.offsets_url) as client:
            for topic in TOPICS:
                result["infos"][topic] = client.log_info(topic)
            result["rows"]["rot/torn"] = read_log(client, "rot/torn")
            result["rows"]["rot/open-index"] = read_log(client, "rot/open-index")
        yield result
    finally:
        broker.stop()


def test_a_torn_last_record_is_truncated_and_appends_continue_densely(damaged):
    broker = damaged["broker"]
    rows = damaged["rows"]["rot/torn"]

    assert damaged["infos"]["rot/torn"].end_offset == COUNT - 1
    assert _payloads(rows) == _expected(range(COUNT - 1))
    PahoClient(broker.port, "after").publish("rot/torn", "record after restart", 1)
    with OffsetsClient(broker.offsets_url) as client:
        last = client.fetch("rot/torn", COUNT - 1).data.to_pylist()
    assert [(row["offset"], row["payload"]) for row in last] == [(COUNT - 1, b"record after restart")]


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


def test_an_index_left_open_is_rebuilt_and_every_record_served(damaged):
    assert _payloads(damaged["rows"]["rot/open-index"]) == _expected(range(COUNT))


def test_the_broker_logs_what_recovery_repaired_with_counts(damaged):
    text = damaged["broker"].log_path.read_text()

    assert "after an unclean shutdown" in text
    assert "dropped 11 bytes" in text  # the torn tail
    assert f"records [{damaged['active_damaged']}] failed their checksum" in text
    assert "indexes rebuilt" in text


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
