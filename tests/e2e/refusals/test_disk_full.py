"""A broker whose disk fills up rides it out: while the commitlog cannot write, QoS 1 publishes are refused
(v5 PUBACK 0x97 Quota exceeded with the reason, a 3.1.1 publisher closed), QoS 0 is still delivered and
/metrics answers with the shortage; once space is freed the broker takes QoS 1 publishes again without a
restart, and every acknowledged message is in its log with no gap in the offsets.

The broker's data directory is a small tmpfs mounted in the broker's own mount namespace (``unshare``), so
the kernel answers ENOSPC for real; a filler file made and deleted inside that namespace (``nsenter``) fills
and frees it. Nothing is mounted where the test runs: the tmpfs goes with the broker process."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.protocol.packets import PubAck, Publish, PubRec
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import RawClient, close_all, wait_for
from tests.e2e.cluster.proof import metric
from tests.e2e.commitlog.e2e_helpers import read_log

TOPIC = "site/gw-5/telemetry"
PAYLOAD = b"x" * 1000
QUOTA_EXCEEDED = 0x97
MOUNT_TMPFS = 'mkdir -p "$0" && mount -t tmpfs -o size=4m tmpfs "$0" && exec "$@"'


def in_broker_namespace(broker: BrokerProcess, *command: str) -> None:
    """Run ``command`` in the broker's mount namespace, where its data directory is the small tmpfs."""
    assert broker.process is not None
    subprocess.run(["nsenter", "-t", str(broker.process.pid), "-m", "--", *command], check=False, timeout=30)


def health(broker: BrokerProcess) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.admin_port}/health", timeout=10) as answer:
        return json.loads(answer.read())


def test_a_full_disk_refuses_qos1_keeps_serving_and_takes_appends_again_once_space_is_freed(tmp_path: Path):
    broker = BrokerProcess(
        tmp_path, limits={"new_connections_per_second": 0, "messages_per_second_per_client": 0}
    )
    data = tmp_path / "data"
    broker.wrapper = ("unshare", "--mount", "--propagation", "private", "sh", "-c", MOUNT_TMPFS, str(data))
    broker.start()
    filler = str(data / "filler")
    acknowledged: list[bytes] = []
    refused: list[bytes] = []
    try:
        device = RawClient(broker.port, version=5)
        device.connect("gw-5")
        old_device = RawClient(broker.port, version=4)
        old_device.connect("gw-3")
        dashboard = RawClient(broker.port, version=5)
        dashboard.connect("dashboard")
        dashboard.subscribe("site/live/#", 0)
        packet_id = 0

        def publish(label: str) -> PubAck:
            nonlocal packet_id
            packet_id += 1
            payload = b"%s-%d:" % (label.encode(), packet_id) + PAYLOAD
            device.send_packet(Publish(TOPIC, payload, 1, packet_id=packet_id))
            ack = device.recv()
            assert isinstance(ack, PubAck) and ack.packet_id == packet_id, ack
            (acknowledged if ack.reason_code < 0x80 else refused).append(payload)
            return ack

        for _ in range(5):
            assert publish("before").reason_code in (0x00, 0x10)

        in_broker_namespace(broker, "dd", "if=/dev/zero", f"of={filler}", "bs=64k", "status=none")
        for _ in range(64):  # what still fits in the pages the log's files hold is taken
            ack = publish("filling")
            if ack.reason_code >= 0x80:
                break
        assert ack.reason_code == QUOTA_EXCEEDED, ack
        assert ack.properties is not None and "out of disk space" in (ack.properties.reason_string or "")
        for _ in range(3):  # and every QoS 1 publish while the disk is full
            ack = publish("during")
            assert ack.reason_code == QUOTA_EXCEEDED, ack
        device.send_packet(Publish(TOPIC, b"during-qos2", 2, packet_id=1000))
        answer = device.recv()
        assert isinstance(answer, PubRec) and (answer.packet_id, answer.reason_code) == (1000, QUOTA_EXCEEDED)
        old_device.send_packet(Publish("site/gw-3/telemetry", b"during", 1, packet_id=1))
        assert old_device.closed()  # 3.1.1 cannot be told: closed, it resends after reconnecting

        late = RawClient(broker.port, version=5)  # connecting and subscribing go on
        late.connect("late-dashboard")
        late.subscribe("site/live/#", 0)
        device.send_packet(Publish("site/live/gw-5", b"still live", 0))  # QoS 0 is not logged: delivered
        for subscriber in (dashboard, late):
            delivered = subscriber.recv()
            assert isinstance(delivered, Publish) and delivered.payload == b"still live"
        with OffsetsClient(broker.offsets_url) as reader:  # and reads
            readable = [row["payload"] for row in read_log(reader, TOPIC)]
        assert readable[:5] == acknowledged[:5]
        assert metric(broker, "timestone_broker_log_shortage", cause="disk_full") == 1
        assert metric(broker, "timestone_broker_log_shortages_total", cause="disk_full") == 1
        assert metric(broker, "timestone_broker_messages_dropped_total", reason="disk_full") >= 3
        report = health(broker)  # not failed: it waits for space, and says what it waits for
        assert (report["status"], report["commitlog"], report["log_shortage"]) == ("ok", "ok", "disk_full")

        in_broker_namespace(broker, "rm", "-f", filler)
        assert wait_for(lambda: "disk space available again" in broker.log_path.read_text(), timeout=15)
        for _ in range(3):
            assert publish("after").reason_code in (0x00, 0x10)
        old_device = RawClient(broker.port, version=4)
        old_device.connect("gw-3")
        old_device.send_packet(Publish("site/gw-3/telemetry", b"after", 1, packet_id=2))
        assert old_device.recv() == PubAck(2)
        assert metric(broker, "timestone_broker_log_shortage", cause="disk_full") == 0
        assert health(broker)["log_shortage"] is None

        with OffsetsClient(broker.offsets_url) as reader:
            rows = read_log(reader, TOPIC)
        assert [row["offset"] for row in rows] == list(range(len(rows)))  # no hole
        stored = [row["payload"] for row in rows]
        assert [payload for payload in stored if payload in acknowledged] == acknowledged  # none lost
        # A refused publish whose write met the full disk may be there (written once space came back: at
        # least once); one refused while the disk was full is not (nothing of it was kept).
        assert not any(payload.startswith(b"during-") for payload in stored)
        assert set(stored) - set(acknowledged) <= set(refused)
    finally:
        close_all()
        broker.stop()
    log = broker.log_path.read_text()
    assert log.count("out of disk space writing the log") == 1  # once when it starts
    assert log.count("disk space available again") == 1  # and once when it ends
    assert "free space on the filesystem of storage.directory" in log
    assert "refusing further appends" not in log and "Traceback" not in log


def test_a_disk_the_log_filled_is_freed_by_retention_without_a_hand(tmp_path: Path):
    """Retention deletes segments only once a snapshot is durable, and a snapshot is a new file: on a full
    disk the disk reserve (``storage.disk_reserve_bytes``, preallocated at the first seal) is released for
    it, so the records past retention go and QoS 1 is taken again while what filled the disk stays."""
    retention_s = 16  # the 1,600 publishes below take well under a second, seconds on a loaded machine
    broker = BrokerProcess(
        tmp_path,
        limits={"new_connections_per_second": 0, "messages_per_second_per_client": 0},
        storage={"segment_bytes": 65536, "retention_ms": retention_s * 1000, "retention_interval_s": 0.5},
    )
    data = tmp_path / "data"
    broker.wrapper = ("unshare", "--mount", "--propagation", "private", "sh", "-c", MOUNT_TMPFS, str(data))
    broker.start()
    try:
        device = RawClient(broker.port, version=5)
        device.connect("gw-5")
        packet_id = 0

        def publish(count: int) -> list[int]:
            """``count`` QoS 1 publishes, 32 in flight: their reason codes."""
            nonlocal packet_id
            codes: list[int] = []
            for _ in range(0, count, 32):
                window = range(packet_id + 1, packet_id + 33)
                for number in window:
                    device.send_packet(Publish(TOPIC, b"%d:" % number + PAYLOAD, 1, packet_id=number))
                for number in window:
                    ack = device.recv()
                    assert isinstance(ack, PubAck) and ack.packet_id == number, ack
                    codes.append(ack.reason_code)
                packet_id = window[-1]
            return codes

        began = time.monotonic()
        assert set(publish(1600)) <= {0x00, 0x10}  # about 1.7 MB of log, to be past retention soon
        filled = time.monotonic()
        assert filled - began < retention_s / 2, "the log must fill before retention starts"
        in_broker_namespace(broker, "dd", "if=/dev/zero", f"of={data / 'filler'}", "bs=64k", "status=none")
        assert QUOTA_EXCEEDED in publish(64)

        # No hand frees space: retention frees it as those records pass it. On a loaded machine the 1,600
        # took seconds, so it frees them a few segments a pass, and the first passes may free less than a
        # window of publishes needs (taken again, refused again): once all of them are past it, there is room.
        assert wait_for(lambda: "disk space available again" in broker.log_path.read_text(), timeout=45)
        time.sleep(max(0.0, filled + retention_s + 2 - time.monotonic()))
        assert wait_for(lambda: metric(broker, "timestone_broker_log_shortage", cause="disk_full") == 0)
        assert set(publish(32)) <= {0x00, 0x10}
        with OffsetsClient(broker.offsets_url) as reader:
            rows = read_log(reader, TOPIC)
        assert rows and rows[-1]["payload"] == b"%d:" % packet_id + PAYLOAD
        assert [row["offset"] for row in rows] == list(
            range(rows[0]["offset"], rows[0]["offset"] + len(rows))
        )
        assert rows[0]["offset"] > 0, "what retention deleted is no longer served"
    finally:
        close_all()
        broker.stop()
    log = broker.log_path.read_text()
    assert "bytes of the disk reserve are released for the topic table snapshot" in log
    assert "Traceback" not in log
