"""Telemetry published by MQTT clients in shapes other tools write, through a real broker and the job: a
topic whose {device_id} level is empty (the job's own filter reads it), a JSON payload after a byte order
mark. Each is quarantined saying why, never left in bronze alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipelines.telemetry.config import load_telemetry_config
from tests.e2e.telemetry.telemetry_harness import MqttPublisher, reading, run_available_now

pytestmark = pytest.mark.spark


def published_through_the_job(
    spark, tmp_path: Path, messages: list[tuple[str, bytes]], **sections: Any
) -> Any:
    """``messages`` (topic, payload) published at QoS 1 to a real broker, then the job run over them once
    (``--available-now``); the store of its tables."""
    from tests.e2e.conftest import RunningBroker, broker_config

    config = broker_config(tmp_path, storage={"durability": "group"}, offsets_api={"port": 0})
    running = RunningBroker(config).start()
    publisher = MqttPublisher("edge1", running.port)
    try:
        for topic, payload in messages:
            publisher.publish(topic, payload)
        publisher.flush()
        pipeline = load_telemetry_config(
            {
                "source": {
                    "brokers": [f"edge1=http://127.0.0.1:{running.broker.offsets_port}"],
                    "options": {"fetchRetries": "1"},
                },
                "tables": {"root": str(tmp_path / "tables")},
                "stream": {"checkpoint": str(tmp_path / "checkpoint")},
                "quality": {"gx": {"schedule": "never"}},
                **sections,
            }
        )
        return run_available_now(spark, pipeline, timeout_s=240).store
    finally:
        publisher.close()
        running.stop()


def test_an_empty_device_level_is_quarantined_naming_it(spark, tmp_path) -> None:
    """devices//telemetry matches the job's filter devices/+/telemetry (+ matches an empty level), so the
    record came into bronze, but not the template's expression: it reached neither silver nor quarantine."""
    messages = [
        ("devices//telemetry", reading("x", 1, 20)),
        ("devices/d1/telemetry", reading("d1", 1, 20)),
        ("devices//status", b'{"firmware": "2.0.0"}'),
    ]
    gold = {"devices": {"status_topic_template": "devices/{device_id}/status"}}
    store = published_through_the_job(spark, tmp_path, messages, gold=gold)
    assert [row.device_id for row in store.read("silver_telemetry").collect()] == ["d1"]
    quarantined = [
        tuple(row) for row in store.read("telemetry_quarantine").select("topic", "reason", "detail").collect()
    ]
    assert quarantined == [
        ("devices//telemetry", "unparseable_payload", "topic: its {device_id} level is empty")
    ]
    assert [row.device_id for row in store.read("devices").collect()] == ["d1"]


def test_a_json_payload_after_a_byte_order_mark_is_quarantined_saying_so(spark, tmp_path) -> None:
    """Python's reader skips a UTF-8 byte order mark that Spark's from_json refuses: the detail was the
    catch-all 'json: not an object of the declared fields and types'."""
    messages = [("devices/d1/telemetry", b"\xef\xbb\xbf" + reading("d1", 1, 20))]
    store = published_through_the_job(spark, tmp_path, messages)
    quarantined = [
        tuple(row) for row in store.read("telemetry_quarantine").select("reason", "detail").collect()
    ]
    assert quarantined == [
        ("unparseable_payload", "json: byte 0: a UTF-8 byte order mark before the JSON text")
    ]
