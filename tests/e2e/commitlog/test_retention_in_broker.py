"""Retention as a running broker applies it to logs devices filled over MQTT, read back through the offsets
API: records past `retention_ms` go even when nothing is published any more, readers below the start are
told where the log starts now, and offsets go on where they were."""

from __future__ import annotations

import logging

import pytest

from broker_edge.offsets_api.client import OffsetOutOfRangeError
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import Publish
from tests.e2e.broker_clients import PahoClient, RawClient, wait_for
from tests.e2e.commitlog.e2e_helpers import offsets_client, publish_numbered, read_log

DEVICES = [f"fleet/device-{number}/telemetry" for number in range(3)]


def test_records_of_a_fleet_gone_quiet_expire_by_age(brokers):
    """Devices publish, then go silent: the partition's active segment is rolled by age without another
    append, so its records go once past retention_ms (they outlive it by about segment_ms, not forever)."""
    broker = brokers(storage={"segment_ms": 300, "retention_ms": 600, "retention_interval_s": 0.1})
    for topic in DEVICES:
        publish_numbered(broker, topic, 3)
    client = offsets_client(broker)

    def expired() -> bool:
        return all(log.start_offset == log.end_offset == 3 for log in client.list_logs("fleet/#"))

    assert wait_for(expired, timeout=10), client.list_logs("fleet/#")
    with pytest.raises(OffsetOutOfRangeError) as below:
        client.fetch(DEVICES[0], 0)
    assert (below.value.start, below.value.end) == (3, 3)

    device = PahoClient(broker.port, "device-0")
    device.publish(DEVICES[0], "again", 1)
    device.disconnect()
    assert [(row["offset"], row["payload"]) for row in read_log(client, DEVICES[0])] == [(3, b"again")]


def test_messages_retention_took_from_an_offline_session_are_counted_and_said(brokers, caplog):
    """A persistent session offline past retention never gets the records retention deleted (its log is
    bounded by retention): that was an INFO line and no count, so nothing an operator watches showed a
    device missing messages. They are counted as the drop ``retention`` (one per message) and said at
    WARNING naming the client; the session goes on from where the log starts now."""
    broker = brokers(storage={"segment_ms": 300, "retention_ms": 600, "retention_interval_s": 0.1})
    device = PahoClient(broker.port, "device-7", clean=False, session_expiry=300)
    device.subscribe("fleet/device-7/cmd", 1)
    device.disconnect()
    publish_numbered(broker, "fleet/device-7/cmd", 5)
    client = offsets_client(broker)
    assert wait_for(lambda: client.list_logs("fleet/#")[0].start_offset == 5, timeout=10)
    publisher = PahoClient(broker.port, "platform")
    publisher.publish("fleet/device-7/cmd", "after", 1)

    back = PahoClient(broker.port, "device-7", clean=False, session_expiry=300)

    assert [message.payload for message in back.expect(1)] == [b"after"]
    assert broker.drops("retention") == 5
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "retention" in r.getMessage()]
    assert warnings and getattr(warnings[0], "client_id", None) == "device-7"


def test_a_fleet_back_after_retention_is_said_in_one_line_per_interval_not_one_per_device(brokers, caplog):
    """Each device back after retention took its messages is counted; the WARNING is one line per interval
    with how many more there were, not one per device and topic (a fleet reconnecting would flood the log)."""
    broker = brokers(storage={"segment_ms": 300, "retention_ms": 600, "retention_interval_s": 0.1})
    devices = [f"device-{n}" for n in range(4)]
    for name in devices:
        device = PahoClient(broker.port, name, clean=False, session_expiry=300)
        device.subscribe(f"fleet/{name}/cmd", 1)
        device.disconnect()
        publish_numbered(broker, f"fleet/{name}/cmd", 3)
    client = offsets_client(broker)
    assert wait_for(lambda: all(info.start_offset == 3 for info in client.list_logs("fleet/#")), timeout=10)
    publisher = PahoClient(broker.port, "platform")
    for name in devices:
        publisher.publish(f"fleet/{name}/cmd", "after", 1)

    for name in devices:
        back = PahoClient(broker.port, name, clean=False, session_expiry=300)
        assert [message.payload for message in back.expect(1)] == [b"after"]

    assert broker.drops("retention") == 12
    said = [r for r in caplog.records if r.levelname == "WARNING" and "went by retention" in r.getMessage()]
    assert len(said) == 1


def test_a_burst_after_a_quiet_partition_rolled_goes_into_a_segment_of_its_own(brokers, caplog):
    """A quiet partition's segment is rolled by age, leaving an empty active segment with room for
    `segment_bytes` / 33 + 1 rows (125 of 4 KiB). A device's burst of twice that many QoS 1 publishes on one
    topic, read in one turn, is one batch: it went into the empty segment, whose open index then refused the
    rows past its room at its next checkpoint (ERROR, a traceback) and the broker stopped without its
    clean-shutdown marker. It now starts a segment made for it: every publish acknowledged, nothing logged
    at ERROR, a clean restart that serves every record."""
    storage = {
        "segment_bytes": 4096,
        "index_checkpoint_bytes": 4096,  # the active segment's open index written every 4 KiB
        "segment_ms": 300,
        "retention_interval_s": 0.1,
        "partitions": 1,
    }
    limits = {"receive_maximum": 1000}  # the burst in flight at once, so that one read takes it whole
    broker = brokers(storage=storage, limits=limits)
    topic = DEVICES[0]
    publish_numbered(broker, topic, 3)
    assert broker.broker.store is not None
    part = broker.broker.store.partition_logs[0]
    assert wait_for(lambda: len(part.segments) > 1 and part.active is not None and part.active.size == 0, 10)
    empty = part.active
    assert empty is not None and empty.capacity == 4096 // 33 + 1
    burst = 2 * empty.capacity
    device = RawClient(broker.port, version=4)
    device.connect("burst")
    device.send(b"".join(encode(Publish(topic, b"x", 1, packet_id=n), 4) for n in range(1, burst + 1)))
    assert [device.recv().packet_id for _ in range(burst)] == list(range(1, burst + 1))
    device.close()
    broker.stop()
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="broker_edge.storage.store"):
        again = brokers(storage=storage, limits=limits)
    assert [r.getMessage() for r in caplog.records if "after a clean shutdown" in r.getMessage()]
    assert [row["offset"] for row in read_log(offsets_client(again), topic)] == list(range(3 + burst))
    assert not len(empty.rows or ())  # the empty segment was sealed with no rows (its rows None then)
