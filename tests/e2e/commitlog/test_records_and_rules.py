"""What a logged publish becomes on disk, and which publishes the broker's config says to log and keep.

Records are checked field by field through the offsets API and byte by byte in the segment file, with the
checksum recomputed by an independent CRC32C (Castagnoli) written here. Persistence and retention rules
come from the broker config, as an operator writes them.
"""

from __future__ import annotations

import json
import struct
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import pytest

from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import Publish
from broker_edge.protocol.properties import Properties
from tests.e2e.broker_clients import PahoClient, RawClient, wait_for
from tests.e2e.commitlog.e2e_helpers import (
    OPTED_IN,
    offset_of,
    offsets_client,
    publish_numbered,
    read_log,
    replay_from,
)
from tests.unit.broker_edge.storage.log_helpers import entry_positions, partition_segments


def crc32c_reference(data: bytes) -> int:
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit: slow, obviously correct."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _records_json(broker, topic: str) -> list[dict]:
    url = f"http://127.0.0.1:{broker.broker.offsets_port}/v1/logs/{topic.replace('/', '%2F')}/records"
    with urllib.request.urlopen(f"{url}?offset=0&format=jsonl") as answer:
        return [json.loads(line) for line in answer.read().splitlines()]


def _data(broker) -> Path:
    return Path(broker.config.storage.directory)


def test_a_record_keeps_what_matters_downstream_and_the_broker_time(brokers):
    broker = brokers()
    device = PahoClient(broker.port, "sensor-17")
    before = int(time.time() * 1000)
    device.publish(
        "plant/7/temp",
        b'{"celsius": 21.5}',
        2,
        retain=True,
        properties=_publish_properties([("unit", "C"), ("unit", "K"), ("site", "Köln")], "application/json"),
    )
    after = int(time.time() * 1000)

    [line] = _records_json(broker, "plant/7/temp")

    assert line["offset"] == 0
    assert before <= line["timestamp_ms"] <= after
    assert (line["client_id"], line["qos"], line["retain"]) == ("sensor-17", 2, True)
    assert line["user_properties"] == [["unit", "C"], ["unit", "K"], ["site", "Köln"]]
    assert (line["content_type"], line["payload_format_indicator"]) == ("application/json", 1)
    assert line["payload_text"] == '{"celsius": 21.5}'


def test_the_stored_frame_carries_a_crc32c_of_its_body(brokers):
    assert crc32c_reference(b"123456789") == 0xE3069283  # the published check value of CRC-32C
    broker = brokers()
    publish_numbered(broker, "crc/check", 3)
    broker.stop()
    segment = partition_segments(_data(broker))[0]
    data = segment.read_bytes()

    for number, position in enumerate(entry_positions(segment)):
        length, stored = struct.unpack_from("<II", data, position + 8)  # the frame, after its entry header
        body = data[position + 16 : position + 16 + length]
        assert stored == crc32c_reference(body)
        assert stored != zlib.crc32(body)  # Castagnoli, not the zlib polynomial
        assert body.endswith(str(number).encode())


def test_segments_roll_by_size_with_an_index_each_and_lookups_by_time(brokers):
    broker = brokers(storage={"segment_bytes": 1024})
    publish_numbered(broker, "roll/a", 5)
    time.sleep(0.01)
    middle = int(time.time() * 1000)
    time.sleep(0.01)
    publish_numbered(broker, "roll/a", 55, first=5)

    with offsets_client(broker) as api:
        at_time = api.offset_for_timestamp("roll/a", middle)
        rows = read_log(api, "roll/a")
    logs = partition_segments(_data(broker))

    def sealed_indexes() -> list[str]:  # (written by the sealer thread once a rolled segment is durable)
        return [path.stem for path in partition_segments(_data(broker), suffix=".index")]

    assert len(logs) >= 3
    assert all(path.stat().st_size <= 1024 for path in logs)
    firsts = [struct.unpack_from("<Q", path.read_bytes(), 8 + 9)[0] for path in logs]  # first record offsets
    counts = [len(entry_positions(path)) for path in logs]
    assert firsts == [sum(counts[:number]) for number in range(len(logs))]  # dense across segments
    assert wait_for(lambda: sealed_indexes() == [path.stem for path in logs[:-1]]), sealed_indexes()
    assert at_time == 5
    assert [row["payload"] for row in rows] == [str(n).encode() for n in range(60)]


def test_persistence_rules_pick_topics_and_qos_levels(brokers):
    rules = [
        {"pattern": "debug/#", "qos": []},
        {"pattern": "metrics/#", "qos": [0, 1, 2]},
        {"pattern": "#", "qos": [1, 2]},
    ]
    broker = brokers(storage={"persist": rules})
    watcher = PahoClient(broker.port, "watcher", connect_properties=OPTED_IN)
    watcher.subscribe("#", 1)
    device = PahoClient(broker.port, "device")
    for topic, qos in (("metrics/cpu", 0), ("metrics/cpu", 1), ("state/door", 0), ("state/door", 1)):
        device.publish(topic, f"{topic} at qos {qos}", qos)
    device.publish("debug/trace", "never logged", 1)

    got = {(m.topic, m.payload.decode()): m for m in watcher.expect(5)}
    with offsets_client(broker) as api:
        logs = {info.topic: info.end_offset for info in api.list_logs()}

    assert logs == {"metrics/cpu": 2, "state/door": 1}
    assert offset_of(got["metrics/cpu", "metrics/cpu at qos 0"]) == 0  # QoS 0 logged: this pattern asks
    assert offset_of(got["state/door", "state/door at qos 1"]) == 0
    unlogged = [got["state/door", "state/door at qos 0"], got["debug/trace", "never logged"]]
    assert all("offset" not in dict(getattr(m.properties, "UserProperty", [])) for m in unlogged)


def test_an_unlogged_qos1_publish_is_acknowledged_behind_the_logged_ones_read_before_it(brokers):
    """[MQTT-4.6.0-2] as the server keeps it: a topic the rules do not log is routed at once, but its PUBACK
    waits for the logged publishes the client sent before it, where it was written ahead of them."""
    rules = [{"pattern": "debug/#", "qos": []}, {"pattern": "#", "qos": [1, 2]}]
    broker = brokers(storage={"persist": rules})
    raw = RawClient(broker.port, 5)
    raw.connect("mixed")
    sent = ["state/a", "state/b", "debug/trace", "state/c", "debug/more"]
    raw.send(b"".join(encode(Publish(t, b"x", 1, packet_id=n + 1), 5) for n, t in enumerate(sent)))
    assert [raw.recv().packet_id for _ in sent] == [1, 2, 3, 4, 5]


def test_retention_per_pattern_by_bytes_and_by_age_in_segments_the_topics_share(brokers):
    """The three topics' records share segments: each topic's start moves by its own rule (whole groups:
    its records in one segment), and the segments stay while `kept/a` still has records in them."""
    rules = [
        {"pattern": "small/#", "retention_bytes": 1500},
        {"pattern": "brief/#", "retention_ms": 1},
        {"pattern": "#"},
    ]
    broker = brokers(storage={"persist": rules, "segment_bytes": 600, "retention_interval_s": 0.1})
    publisher = PahoClient(broker.port, "interleaving")
    for number in range(60):  # the three topics' records interleaved: every segment holds each topic's
        for topic in ("small/a", "brief/a", "kept/a"):
            publisher.publish(topic, str(number), 1)
    publisher.disconnect()
    segments = len(partition_segments(_data(broker)))

    with offsets_client(broker) as api:
        # age: every group of brief/a but the active segment's goes once its newest record is older than 1 ms
        assert wait_for(
            lambda: api.log_info("small/a").start_offset > 0 and api.log_info("brief/a").start_offset > 0
        )
        small, brief, kept = (api.log_info(topic) for topic in ("small/a", "brief/a", "kept/a"))
        first_kept_small = read_log(api, "small/a")[0]
        kept_brief = read_log(api, "brief/a")

    assert small.bytes <= 1500 + 600 and small.end_offset == 60
    assert small.start_offset == first_kept_small["offset"]
    assert brief.end_offset == 60
    assert brief.start_offset == kept_brief[0]["offset"] > 0  # its groups in the active segment are kept
    assert kept.start_offset == 0
    assert len(partition_segments(_data(broker))) == segments  # kept/a's records keep every segment


def test_a_reader_below_the_start_gets_out_of_range_with_the_start_never_a_jump(brokers):
    rules = [{"pattern": "#", "retention_bytes": 1200}]
    broker = brokers(storage={"persist": rules, "segment_bytes": 600, "retention_interval_s": 0.1})
    publish_numbered(broker, "short/a", 60)
    with offsets_client(broker) as api:
        assert wait_for(lambda: api.log_info("short/a").start_offset > 0)
        start = api.log_info("short/a").start_offset

    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(
            f"http://127.0.0.1:{broker.broker.offsets_port}/v1/logs/short%2Fa/records?offset=0"
        )
    body = json.loads(caught.value.read())
    device = PahoClient(broker.port, "late-device")
    device.subscribe("short/a", 1, properties=replay_from("0"))
    first = device.expect(1)[0]
    raw = RawClient(broker.port, 5)
    raw.connect("raw-device")
    suback = raw.subscribe("short/+", 1, properties=Properties(user_properties=[("offset", "0")]))
    v311 = PahoClient(broker.port, "v311-device", version=4)
    v311.subscribe("$offset/0/short/a", 1)

    assert caught.value.code == 416
    assert (body["error"], body["offset"], body["start_offset"], body["end_offset"]) == (
        "offset_out_of_range",
        0,
        start,
        60,
    )
    assert offset_of(first) == start  # an MQTT 5 device sees where its replay really starts
    assert suback.reason_codes == [1]  # granted, and told why it starts later than asked:
    assert (
        suback.properties.reason_string
        == f"offset 0 of 'short/a' is outside [{start}, 60]: replaying from {start}"
    )
    told = [
        json.loads(value) for key, value in suback.properties.user_properties if key == "offset_out_of_range"
    ]
    assert told == [{"topic": "short/a", "offset": 0, "start_offset": start, "end_offset": 60}]
    assert v311.expect(1)[0].payload == str(start).encode()  # v3.1.1 has no way to be told: the log says it


def _publish_properties(user_properties: list[tuple[str, str]], content_type: str):
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    properties = Properties(PacketTypes.PUBLISH)
    properties.UserProperty = user_properties
    properties.ContentType = content_type
    properties.PayloadFormatIndicator = 1
    return properties
