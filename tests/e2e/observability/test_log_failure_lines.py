"""A broker whose commitlog failed for good (its data directory removed under it) refuses every logged
publish, and says so in a few lines, not two lines per publish: a fleet publishing at its usual rate must not
fill the disk the operator is trying to look at."""

from __future__ import annotations

import shutil
from pathlib import Path

from broker_edge.protocol.packets import PubAck, Publish
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import RawClient, close_all

PUBLISHES = 200
TOPIC = "site/gw-1/telemetry"


def test_a_failed_log_is_said_in_a_few_lines_however_many_publishes_it_refuses(tmp_path: Path):
    broker = BrokerProcess(
        tmp_path,
        storage={"segment_bytes": 65536},
        limits={"messages_per_second_per_client": 0},
        sys_topics={"enabled": False},
    )
    broker.start()
    refused = 0
    try:
        device = RawClient(broker.port, version=5)
        device.connect("gw-1")
        device.send_packet(Publish(TOPIC, b"before", 1, packet_id=1))
        assert device.recv() == PubAck(1, 0x10)  # the topic's log made (none subscribed)
        shutil.rmtree(tmp_path / "data")  # the next segment cannot be made: the log fails for good
        for packet_id in range(2, PUBLISHES + 2):
            device.send_packet(Publish(TOPIC, b"x" * 5000, 1, packet_id=packet_id))
            ack = device.recv()
            assert isinstance(ack, PubAck) and ack.packet_id == packet_id, ack
            refused += ack.reason_code >= 0x80
    finally:
        close_all()
        broker.stop()
    assert refused >= PUBLISHES // 2  # the segment rolled early: most of them met the failed log
    lines = broker.log_path.read_text().splitlines()
    failed = [line for line in lines if "publishes not acknowledged" in line or "failed: log write" in line]
    assert 1 <= len(failed) <= 4, "\n".join(failed[:10])
    assert any("log write failed, refusing further appends" in line for line in lines)
    assert "Traceback" not in "\n".join(lines)
