"""A broker alone keeps its retained messages across a restart (a clean stop, or a crash after its last
periodic save): a device subscribing after it gets them, as before it."""

from __future__ import annotations

import logging
import time

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, wait_for


def _retained(port: int) -> dict[str, bytes]:
    device = PahoClient(port, "late-device")
    device.subscribe("state/#", 1)
    got: dict[str, bytes] = {}
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and len(got) < 2:
        if not device.messages.empty():
            message = device.messages.get()
            got[message.topic] = message.payload
        time.sleep(0.01)
    device.expect_none(0.3)
    device.close()
    return got


def test_retained_messages_survive_a_clean_stop(brokers):
    broker = brokers()
    publisher = PahoClient(broker.port, "pub")
    publisher.publish("state/a", "on", 1, retain=True)
    publisher.publish("state/b", "off", 0, retain=True)
    publisher.publish("state/c", "gone", 1, retain=True)
    publisher.publish("state/c", "", 1, retain=True)  # cleared
    expiring = PahoProperties(PacketTypes.PUBLISH)
    expiring.MessageExpiryInterval = 1
    publisher.publish("state/d", "soon", 1, retain=True, properties=expiring)
    publisher.close()
    broker.stop()
    time.sleep(1.1)  # state/d expires while the broker is down

    again = brokers()

    assert _retained(again.port) == {"state/a": b"on", "state/b": b"off"}


def test_retained_messages_survive_a_crash_after_their_save(tmp_path):
    process = BrokerProcess(tmp_path, sessions={"persist_interval_s": 0.1}, sys_topics={"enabled": False})
    path = tmp_path / "data" / "meta" / "retained.bin"
    process.start()
    try:
        publisher = PahoClient(process.port, "pub")
        publisher.publish("state/a", "on", 1, retain=True)
        publisher.close()
        assert wait_for(lambda: path.exists() and b"state/a" in path.read_bytes())
        process.kill()
        process.start()
        assert _retained(process.port) == {"state/a": b"on"}
    finally:
        process.stop()


def test_a_retained_file_that_cannot_be_read_is_set_aside_and_the_broker_starts_without_it(brokers, tmp_path):
    broker = brokers()
    PahoClient(broker.port, "pub").publish("state/a", "on", 1, retain=True)
    broker.stop()
    path = tmp_path / "a" / "meta" / "retained.bin"
    path.write_bytes(b"TSRET001" + b"\x00" * 8 + b"\x05\x00\x00\x00garbage")

    again = brokers()

    assert _retained(again.port) == {}
    assert list(path.parent.glob("retained.bin.corrupt-*"))


def test_a_bit_flipped_in_a_retained_topic_is_never_served_under_another_topic(brokers, tmp_path, caplog):
    """A disk's flipped bit in a topic name of retained.bin ('state/a' read as 'state/c') must not make a
    device see one thing's state as another's: that entry is dropped, said at ERROR, the others restored."""
    broker = brokers()
    publisher = PahoClient(broker.port, "pub")
    publisher.publish("state/a", "on", 1, retain=True)
    publisher.publish("state/b", "off", 1, retain=True)
    publisher.close()
    broker.stop()
    path = tmp_path / "a" / "meta" / "retained.bin"
    data = bytearray(path.read_bytes())
    at = data.index(b"state/a") + len("state/")
    data[at] ^= 0x02  # 'a' -> 'c'
    path.write_bytes(bytes(data))

    with caplog.at_level(logging.ERROR, logger="broker_edge.runtime.retained_file"):
        again = brokers()

    assert _retained(again.port) == {"state/b": b"off"}
    assert "1 of its 2 retained messages are damaged" in caplog.text
    assert list(path.parent.glob("retained.bin.corrupt-*"))  # kept for inspection
    assert b"state/b" in path.read_bytes() and b"state/c" not in path.read_bytes()  # written again at once
