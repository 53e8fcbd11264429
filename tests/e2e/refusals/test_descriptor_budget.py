"""One descriptor budget: a broker whose process may open few files caps ``limits.max_connections`` to what
is left after the store, the HTTP endpoints and the listeners (WARNING naming the settings), closes further
connections at accept (counted), and the QoS 1 publishes of the connected clients keep being accepted and
stored, across more topics than the store keeps files open."""

from __future__ import annotations

import re
import urllib.request
from typing import Any

import pytest

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.protocol.packets import ConnAck, PubAck, Publish
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import RawClient, close_all
from tests.e2e.commitlog.e2e_helpers import read_log

LIMITED: dict[str, Any] = {
    "limits": {"max_connections": 5000, "new_connections_per_second": 0},
    "storage": {"max_open_files": 16},
    "admin_http": {"max_connections": 4},
    "offsets_api": {"max_connections": 4},
}


def metric(broker: BrokerProcess, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.admin_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_connections_stop_at_the_budget_and_publishes_keep_being_stored(tmp_path):
    broker = BrokerProcess(tmp_path, descriptor_limit=256, **LIMITED).start()
    try:
        warning = re.search(
            r"limits.max_connections 5000 does not fit .* capped to (\d+)", broker.log_path.read_text()
        )
        assert warning, broker.log_path.read_text()
        cap = int(warning.group(1))
        assert 0 < cap < 256 - 16
        clients, refused = [], 0
        for number in range(cap + 10):
            client = RawClient(broker.port, version=5)
            answer = client.connect(f"meter-{number}")
            if isinstance(answer, ConnAck):
                assert answer.reason_code == 0
                clients.append(client)
            else:
                assert answer is None  # closed at accept
                refused += 1
        assert (len(clients), refused) == (cap, 10)
        assert metric(broker, 'timestone_broker_connections_refused_total{reason="max_connections"}') == 10

        for number in range(60):  # more topics than storage.max_open_files: the pool churns
            client = clients[number % len(clients)]
            client.send_packet(Publish(f"site/meter/{number}", str(number).encode(), 1, packet_id=1))
            ack = client.recv()
            assert isinstance(ack, PubAck) and ack.reason_code in (0x00, 0x10), (
                ack
            )  # 0x10: accepted, no subscriber
        assert "out of file descriptors" not in broker.log_path.read_text()
    finally:
        close_all()
        broker.stop()
    broker.descriptor_limit = None
    broker.start()
    try:
        with OffsetsClient(broker.offsets_url) as reader:
            for number in range(60):
                assert [row["payload"] for row in read_log(reader, f"site/meter/{number}")] == [
                    str(number).encode()
                ]
    finally:
        broker.stop()


@pytest.mark.parametrize(
    ("limits", "level"),
    [({}, "INFO"), ({"max_connections": 5000}, "WARNING")],
    ids=["default-is-info", "chosen-is-warning"],
)
def test_a_cap_of_the_default_is_info_and_of_a_chosen_value_a_warning(tmp_path, limits, level):
    broker = BrokerProcess(
        tmp_path, descriptor_limit=512, limits=limits, storage={"max_open_files": 16}
    ).start()
    try:
        asked = limits.get("max_connections", 20_000)
        [line] = [
            line
            for line in broker.log_path.read_text().splitlines()
            if f"limits.max_connections {asked} does not fit" in line
        ]
        assert f" {level} broker_edge.server: " in line
        client = RawClient(broker.port, version=5)
        assert client.connect("meter-1").reason_code == 0  # capped, not refused
    finally:
        close_all()
        broker.stop()
