"""No topic name can reach the broker's own files: topic names live in the catalog of ``log/``, broker files
in ``meta/``.

Written as the attack, on a real broker process stopped and started again: QoS 1 publishes to topics named
like the broker's files (``CLEAN_SHUTDOWN``, ``sessions.json``, ``sessions.json.tmp``, ``meta``, ...) used to
make the next stop exit 1 for ever, or to silently defeat session persistence. And an existing data directory
of the oldest layout (topic directories and broker files side by side) is moved into the new one at start,
losing nothing.
"""

from __future__ import annotations

import json
import shutil

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess
from broker_edge.storage import AppendRecord
from tests.e2e.broker_clients import PahoClient
from tests.unit.broker_edge.storage.layout2 import as_layout_1, write_layout_2

HOSTILE_TOPICS = [
    "CLEAN_SHUTDOWN",
    "sessions.json",
    "sessions.json.tmp",
    "meta",
    "topics",
    "meta/sessions.json",
    "LAYOUT",
    ".layout-2",
    ".layout-3",
    "log",
    "log/catalog",
    "../meta",
]


def read_all(process: BrokerProcess, topic: str) -> list[bytes]:
    with OffsetsClient(process.offsets_url) as client:
        fetched = client.fetch(topic, "earliest", max_records=100)
        return [bytes(row["payload"]) for row in fetched.data.to_pylist()]


def stop_cleanly(process: BrokerProcess) -> int:
    process.stop()
    return process.process.returncode


def broker_with_an_offline_device(tmp_path) -> BrokerProcess:
    """A broker process with one persistent session, offline, subscribed to ``cmd/#`` at QoS 1."""
    process = BrokerProcess(tmp_path, sys_topics={"enabled": False}).start()
    device = PahoClient(process.port, "device", clean=False, session_expiry=3600)
    assert device.subscribe("cmd/#", 1) == [1]
    device.disconnect()
    return process


def test_topics_named_like_broker_files_are_plain_logs_and_restarts_keep_working(tmp_path):
    process = broker_with_an_offline_device(tmp_path)
    try:
        attacker = PahoClient(process.port, "attacker")
        for topic in HOSTILE_TOPICS:
            attacker.publish(topic, f"payload of {topic}".encode(), 1)
        attacker.publish("cmd/reboot", b"queued for the device", 1)
        attacker.disconnect()
        assert stop_cleanly(process) == 0

        for _ in range(2):  # every later stop and start still works
            process.start()
            assert stop_cleanly(process) == 0
        assert "Is a directory" not in process.log_path.read_text()

        process.start()
        device = PahoClient(process.port, "device", clean=False, session_expiry=3600)
        assert device.connack_result[0].session_present is True
        [queued] = device.expect(1)
        assert (queued.topic, queued.payload) == ("cmd/reboot", b"queued for the device")
        for topic in HOSTILE_TOPICS:
            assert read_all(process, topic) == [f"payload of {topic}".encode()]
        with OffsetsClient(process.offsets_url) as client:
            listed = sorted(info.topic for info in client.list_logs())
        assert listed == sorted([*HOSTILE_TOPICS, "cmd/reboot"])  # nothing renamed, nothing extra
    finally:
        process.stop()
    data = tmp_path / "data"
    assert sorted(path.name for path in data.iterdir()) == ["log", "meta"]
    assert not list(data.rglob("*.unreadable-*"))


def test_an_older_data_directory_is_moved_at_start_keeping_logs_and_sessions(tmp_path):
    """The oldest layout, as a broker of then left it: the device's session (saved by a broker now, with its
    message waiting in the log) and the logs as topic directories side by side with the broker's files."""
    process = broker_with_an_offline_device(tmp_path)
    topics = ("plant/1/temp", "topics", "meta", "log")  # an old log may well be called like the new dirs
    try:
        publisher = PahoClient(process.port, "publisher")
        publisher.publish("cmd/update", b"waiting", 1)
        publisher.disconnect()
        assert stop_cleanly(process) == 0
        data = tmp_path / "data"
        sessions = (data / "meta" / "sessions.json").read_text()
        shutil.rmtree(data)
        logs = {topic: [AppendRecord(f"kept: {topic}".encode())] for topic in topics}
        write_layout_2(data, {**logs, "cmd/update": [AppendRecord(b"waiting", client_id="publisher")]})
        (data / "meta" / "sessions.json").write_text(sessions)
        as_layout_1(data)
        assert json.loads((data / "sessions.json").read_text())["sessions"][0]["client_id"] == "device"
        assert (data / "topics").is_dir() and (data / "meta").is_dir()  # the old logs named so

        process.start()
        for topic in topics:
            assert read_all(process, topic) == [f"kept: {topic}".encode()]
        device = PahoClient(process.port, "device", clean=False, session_expiry=3600)
        assert device.connack_result[0].session_present is True
        assert [m.payload for m in device.expect(1)] == [b"waiting"]
        log_text = process.log_path.read_text()
        assert "after a clean shutdown" in log_text
        assert "moved to layout 2" in log_text and "upgraded to layout 3" in log_text
    finally:
        process.stop()
    assert sorted(path.name for path in data.iterdir()) == ["log", "meta"]
    assert (data / "meta" / "LAYOUT").read_text() == "3\n"
