"""Persistent sessions survive a broker restart: subscriptions, expiry, and the log as their offline queue.

Each test stops a real broker and starts a new one on the same storage directory (or kills a child-process
broker), with real clients: paho MQTT 5 and 3.1.1, and a raw client where the test must choose exactly which
deliveries to acknowledge.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from broker_edge.config import ConfigError, load_dataclass
from broker_edge.engine.routing.subscriptions import SubscriptionOptions
from broker_edge.engine.sessions.snapshot import FORMAT, FORMAT_VERSION, add_checks
from broker_edge.protocol.packets import ConnAck, PubAck, PubComp, Publish, PubRec, PubRel
from broker_edge.protocol.properties import Properties
from broker_edge.runtime.launcher import BrokerProcess
from broker_edge.runtime.session_store import SESSIONS_FILE
from broker_edge.settings.broker import BrokerConfig
from broker_edge.storage.layout import open_layout
from tests.e2e.broker_clients import PahoClient, RawClient, wait_for
from tests.e2e.commitlog.e2e_helpers import OPTED_IN, offset_of, opted_in, publish_numbered

PERSISTENT: dict[int, dict[str, Any]] = {
    5: {"clean": False, "session_expiry": 300, "connect_properties": OPTED_IN},
    4: {"clean": False},
}
"""A persistent session per version: v5 Session Expiry Interval (and the ``offset`` user property on its
deliveries), v3.1.1 clean session 0."""


def restarted(broker, brokers, name: str = "a", **sections):
    """Stop ``broker`` cleanly and start a new one on the same storage directory."""
    broker.stop()
    return brokers(name, **sections)


def sessions_file(broker) -> dict:
    """The sessions file the broker wrote, decoded."""
    return json.loads(broker.broker.session_store.path.read_text())


def session_present(broker, client_id: str, version: int = 5) -> bool:
    """Connect ``client_id`` with a persistent session; whether CONNACK says session present."""
    client = PahoClient(broker.port, client_id, version=version, **PERSISTENT[version])
    return client.connack_result[0].session_present


def raw_offset(packet: Publish) -> int:
    return int(dict(packet.properties.user_properties)["offset"])


@pytest.mark.mqtt311("MQTT-4.6.0-5", "MQTT-4.6.0-6")
@pytest.mark.mqtt5("MQTT-4.6.0-5", "MQTT-4.6.0-6")
@pytest.mark.parametrize("version", [5, 4])
def test_offline_session_gets_everything_published_before_the_restart_once_in_order(brokers, version):
    broker = brokers()
    device = PahoClient(broker.port, f"device-v{version}", version=version, **PERSISTENT[version])
    assert device.subscribe("fleet/+/cmd", 1) == [1]
    device.disconnect()
    publish_numbered(broker, "fleet/7/cmd", 6)

    broker = restarted(broker, brokers)
    again = PahoClient(broker.port, f"device-v{version}", version=version, **PERSISTENT[version])
    assert again.connack_result[0].session_present is True
    got = again.expect(6)
    assert [m.payload for m in got] == [str(n).encode() for n in range(6)]
    if version == 5:
        assert [offset_of(m) for m in got] == list(range(6))
    again.expect_none()
    PahoClient(broker.port, "backend").publish("fleet/8/cmd", b"live", 1)  # the subscription came back too
    assert again.expect(1)[0].payload == b"live"


def test_delivered_but_unacknowledged_messages_are_delivered_again_after_the_restart(brokers):
    broker = brokers()
    raw = RawClient(broker.port, 5)
    raw.connect("slow", clean_start=False, properties=opted_in())
    raw.subscribe("r/1", 1)
    publish_numbered(broker, "r/1", 3)
    first, second, third = raw.recv(), raw.recv(), raw.recv()
    assert [raw_offset(p) for p in (first, second, third)] == [0, 1, 2]
    raw.send_packet(PubAck(first.packet_id))  # only offset 0 is acknowledged
    assert wait_for(lambda: broker.call(lambda: broker.broker.router.inflight_count()) == 2)

    broker = restarted(broker, brokers)
    again = RawClient(broker.port, 5)
    ack = again.connect("slow", clean_start=False, properties=opted_in())
    assert isinstance(ack, ConnAck) and ack.session_present
    redelivered = [again.recv(), again.recv()]
    assert [raw_offset(p) for p in redelivered] == [1, 2]
    assert [p.payload for p in redelivered] == [b"1", b"2"]
    for packet in redelivered:
        again.send_packet(PubAck(packet.packet_id))
    again.recv_none()


def test_a_session_that_expires_during_the_downtime_is_gone(brokers, caplog):
    broker = brokers()
    for client_id, expiry in (("short", 1), ("long", 300)):
        client = PahoClient(broker.port, client_id, clean=False, session_expiry=expiry)
        client.subscribe("x", 1)
        client.disconnect()
    assert wait_for(lambda: not broker.connected("short") and not broker.connected("long"))
    broker.stop()
    time.sleep(1.1)

    with caplog.at_level(logging.INFO, logger="broker_edge.runtime.session_store"):
        broker = brokers()
    assert "restored 1 persistent sessions" in caplog.text and "(1 expired" in caplog.text
    long = PahoClient(broker.port, "long", clean=False, session_expiry=300)
    assert long.connack_result[0].session_present is True
    assert session_present(broker, "short") is False


def test_the_expiry_deadline_continues_from_before_the_restart(brokers):
    broker = brokers()
    PahoClient(broker.port, "dev", clean=False, session_expiry=100).disconnect()
    assert wait_for(lambda: not broker.connected("dev"))
    broker = restarted(broker, brokers)
    router = broker.broker.router
    left = broker.call(lambda: router.sessions["dev"].expires_at - broker.broker.loop.time())
    assert 95 < left <= 100
    broker.tick(101)
    assert broker.call(lambda: "dev" not in router.sessions)


def test_clean_sessions_are_never_written(brokers):
    broker = brokers()
    PahoClient(broker.port, "clean-v3", version=4, clean=True).subscribe("x", 1)
    PahoClient(broker.port, "clean-v5", clean=True).subscribe("x", 1)
    PahoClient(broker.port, "keeper", clean=False, session_expiry=300).subscribe("x", 1)
    broker.stop()
    saved = sessions_file(broker)
    assert [s["client_id"] for s in saved["sessions"]] == ["keeper"]
    assert saved["format"] == FORMAT and saved["version"] == FORMAT_VERSION

    broker = brokers()
    assert session_present(broker, "clean-v3", version=4) is False
    assert session_present(broker, "clean-v5") is False


def test_subscription_options_and_shared_groups_are_restored(brokers):
    broker = brokers()
    raw = RawClient(broker.port, 5)
    raw.connect("opts", clean_start=False, properties=Properties(session_expiry_interval=300))
    raw.subscribe(
        "a/#", 2, no_local=True, retain_as_published=True, retain_handling=2,
        properties=Properties(subscription_identifiers=[42]),
    )  # fmt: skip
    raw.subscribe("$share/workers/jobs/+", 1, packet_id=2)
    broker = restarted(broker, brokers)

    def subscriptions() -> dict:
        session = broker.broker.router.sessions["opts"]
        return {key: (sub.group, sub.topic_filter, sub.options) for key, sub in session.subscriptions.items()}

    assert broker.call(subscriptions) == {
        "a/#": (None, "a/#", SubscriptionOptions(2, True, True, 2, 42)),
        "$share/workers/jobs/+": ("workers", "jobs/+", SubscriptionOptions(1)),
    }
    again = RawClient(broker.port, 5)
    again.connect("opts", clean_start=False, properties=Properties(session_expiry_interval=300))
    PahoClient(broker.port, "pub").publish("jobs/1", b"job", 1)
    job = again.recv()
    assert isinstance(job, Publish) and job.topic == "jobs/1"  # the only member of its group
    assert job.packet_id is not None
    again.send_packet(PubAck(job.packet_id))
    PahoClient(broker.port, "pub2").publish("a/b", b"x", 1)
    delivery = again.recv()
    assert delivery.properties.subscription_identifiers == [42]


def test_a_corrupt_sessions_file_is_moved_aside_and_the_broker_starts_without_it(brokers, tmp_path, caplog):
    directory = Path(open_layout(tmp_path / "a").meta)
    (directory / SESSIONS_FILE).write_bytes(b'{"format": "timestone-sessions", "version": 1, "sess')
    with caplog.at_level(logging.ERROR, logger="broker_edge.runtime.session_store"):
        broker = brokers()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and str(directory / SESSIONS_FILE) in errors[0] and "corrupt" in errors[0]
    aside = list(directory.glob(f"{SESSIONS_FILE}.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().endswith(b'"sess')
    assert not (directory / SESSIONS_FILE).exists()

    device = PahoClient(broker.port, "dev", clean=False, session_expiry=300)
    assert device.connack_result[0].session_present is False
    device.subscribe("x", 1)
    broker.stop()
    assert [s["client_id"] for s in sessions_file(broker)["sessions"]] == ["dev"]  # written anew


def test_a_sessions_file_from_a_newer_broker_is_refused_and_kept(brokers, tmp_path, caplog):
    directory = Path(open_layout(tmp_path / "a").meta)
    newer = {"format": FORMAT, "version": FORMAT_VERSION + 1, "written_at": time.time(), "sessions": []}
    (directory / SESSIONS_FILE).write_text(json.dumps(newer))
    with caplog.at_level(logging.ERROR, logger="broker_edge.runtime.session_store"):
        broker = brokers()
    assert f"format version {FORMAT_VERSION + 1} is newer than this broker reads" in caplog.text
    assert [json.loads(p.read_text()) for p in directory.glob(f"{SESSIONS_FILE}.newer-*")] == [newer]
    assert session_present(broker, "dev") is False


def test_sessions_are_not_persisted_when_switched_off(brokers):
    broker = brokers(sessions={"persist": False})
    PahoClient(broker.port, "dev", clean=False, session_expiry=300).subscribe("x", 1)
    broker = restarted(broker, brokers, sessions={"persist": False})
    assert broker.broker.session_store is None
    assert session_present(broker, "dev") is False


def test_after_a_crash_sessions_come_back_from_the_last_periodic_snapshot(tmp_path):
    """Killed, not stopped: the periodic snapshot has the session; what was published after it comes from
    the log (the snapshot's log end offsets), so nothing acknowledged to the publisher is missed."""
    process = BrokerProcess(tmp_path, sessions={"persist_interval_s": 0.1}, sys_topics={"enabled": False})
    path = tmp_path / "data" / "meta" / SESSIONS_FILE
    process.start()
    try:
        device = PahoClient(process.port, "dev", clean=False, session_expiry=300)
        device.subscribe("t/1", 1)
        assert wait_for(lambda: path.exists() and "dev" in path.read_text())
        device.disconnect()
        publisher = PahoClient(process.port, "pub")
        for n in range(3):
            publisher.publish("t/1", str(n), 1)  # acknowledged: in the log
        process.kill()
        process.start()
        again = PahoClient(process.port, "dev", clean=False, session_expiry=300)
        assert again.connack_result[0].session_present is True
        assert [m.payload for m in again.expect(3)] == [b"0", b"1", b"2"]
    finally:
        process.stop()


@pytest.mark.parametrize(
    ("sessions", "key"),
    [({"persist_interval_s": 0}, "sessions.persist_interval_s"), ({"persist": "yes"}, "sessions.persist")],
)
def test_wrong_values_name_the_key(sessions, key):
    with pytest.raises(ConfigError) as error:
        load_dataclass(BrokerConfig, {"sessions": sessions})
    assert error.value.path == key


def test_a_restored_session_keeps_its_owner_and_another_user_cannot_resume_it(brokers, tmp_path):
    """[MQTT-3.1.4-3] within one identity, across a restart: the sessions file keeps each session's user,
    so after the restart user A still gets "not authorized" for B's client id, and B resumes its session
    with the message queued before the restart."""
    from broker_edge.security.auth import PasswordFile

    passwords = tmp_path / "passwd"
    PasswordFile.set_password(passwords, "userA", "pw-a", create=True)
    PasswordFile.set_password(passwords, "userB", "pw-b")
    secured: dict[str, Any] = {
        "listeners": [{"name": "tcp", "host": "127.0.0.1", "port": 0, "allow_anonymous": False}],
        "auth": {"password_file": str(passwords)},
        "acl": {"rules": [{"permission": "allow", "action": "all", "topic": "%u/#"}]},
    }
    broker = brokers(**secured)
    owner = PahoClient(
        broker.port, "devB", username="userB", password="pw-b", clean=False, session_expiry=300
    )
    assert owner.subscribe("userB/#", 1) == [1]
    owner.disconnect()
    PahoClient(broker.port, "pubB", username="userB", password="pw-b").publish("userB/secret", b"for B", 1)

    broker = restarted(broker, brokers, **secured)
    assert [s["username"] for s in sessions_file(broker)["sessions"] if s["client_id"] == "devB"] == ["userB"]
    for version in (5, 4):
        thief = RawClient(broker.port, version)
        fields = {"properties": Properties(session_expiry_interval=300)} if version == 5 else {}
        refused = thief.connect("devB", username="userA", password=b"pw-a", clean_start=False, **fields)
        assert isinstance(refused, ConnAck) and refused.reason_code == {5: 0x87, 4: 0x05}[version]
        assert refused.session_present is False
    again = PahoClient(
        broker.port, "devB", username="userB", password="pw-b", clean=False, session_expiry=300
    )
    assert again.connack_result[0].session_present is True
    assert [m.payload for m in again.expect(1)] == [b"for B"]


def test_a_restart_restores_no_more_persistent_sessions_than_the_bound(brokers, caplog):
    broker = brokers()
    for n in range(5):
        PahoClient(broker.port, f"dev-{n}", clean=False, session_expiry=300).disconnect()
    with caplog.at_level(logging.WARNING, logger="broker_edge.runtime.session_store"):
        broker = restarted(broker, brokers, sessions={"max_persistent": 3})
    assert broker.call(lambda: broker.broker.router.persistent_count) == 3
    assert "2 persistent sessions not restored: sessions.max_persistent is 3" in caplog.text


def test_a_session_whose_logs_were_wiped_gets_every_message_of_the_new_logs(brokers, tmp_path):
    """The logs deleted while the broker was stopped (meta/ kept): they start again at offset 0 under a new
    store id, and an offline session's saved position in the old log must not skip the new one's records."""
    broker = brokers()
    device = PahoClient(broker.port, "device-w", **PERSISTENT[5])
    assert device.subscribe("fleet/9/cmd", 1) == [1]
    publish_numbered(broker, "fleet/9/cmd", 3)
    assert [offset_of(m) for m in device.expect(3)] == [0, 1, 2]  # acknowledged: its position is 3
    device.disconnect()
    publish_numbered(broker, "fleet/9/cmd", 2, first=3)
    broker.stop()
    assert sessions_file(broker)["sessions"][0]["cursors"] == {"fleet/9/cmd": 3}
    shutil.rmtree(tmp_path / "a" / "log")

    broker = brokers()
    publish_numbered(broker, "fleet/9/cmd", 5, first=100)  # offsets 0 to 4 of the new log
    again = PahoClient(broker.port, "device-w", **PERSISTENT[5])
    assert again.connack_result[0].session_present is True
    got = again.expect(5)
    assert [(offset_of(m), m.payload) for m in got] == [(n, str(100 + n).encode()) for n in range(5)]
    again.expect_none()


def test_a_session_position_past_a_log_that_ended_lower_after_the_restart_reads_from_its_end(brokers, caplog):
    """A log that ends below its end in the sessions file (records lost since it was written: a file cut
    by hand, `durability: none` after a power cut) gives those offsets again: a session positioned past
    its end reads the new records from there, said once at WARNING."""
    broker = brokers()
    device = PahoClient(broker.port, "device-s", **PERSISTENT[5])
    assert device.subscribe("fleet/5/cmd", 1) == [1]
    device.disconnect()
    publish_numbered(broker, "fleet/5/cmd", 3)
    broker.stop()
    path = broker.broker.session_store.path
    document = json.loads(path.read_text())
    document["log_ends"]["fleet/5/cmd"] = 45  # the log had reached 45 when this was written, and the
    document["sessions"][0]["cursors"] = {"fleet/5/cmd": 40}  # device had read up to 40
    path.write_text(json.dumps(add_checks(document)))  # an intact file saying so

    with caplog.at_level(logging.WARNING, logger="broker_edge.runtime.session_store"):
        broker = brokers()
    assert "1 positions of persistent sessions were past their logs' ends" in caplog.text
    publish_numbered(broker, "fleet/5/cmd", 2, first=3)
    again = PahoClient(broker.port, "device-s", **PERSISTENT[5])
    assert [(offset_of(m), m.payload) for m in again.expect(2)] == [(3, b"3"), (4, b"4")]
    again.expect_none()


def test_a_bit_flipped_in_the_sessions_file_never_gives_a_session_to_another_device(brokers, caplog):
    """A disk's flipped bit that leaves the file valid JSON ('device-1' read as 'device-3'): the damaged
    session is not restored (device-3 must not get device-1's subscriptions), the others are, said at
    ERROR."""
    broker = brokers()
    for name in ("device-1", "device-2"):
        PahoClient(broker.port, name, **PERSISTENT[5]).subscribe(f"cmd/{name}", 1)
    broker.stop()
    path = broker.broker.session_store.path
    path.write_bytes(path.read_bytes().replace(b'"device-1"', b'"device-3"'))  # '1' ^ 0x02 == '3'

    with caplog.at_level(logging.ERROR, logger="broker_edge.runtime.session_store"):
        broker = brokers()
    assert "1 persistent sessions failed their check" in caplog.text
    assert session_present(broker, "device-2") is True
    assert session_present(broker, "device-3") is False
    assert list(path.parent.glob(f"{SESSIONS_FILE}.damaged-*"))


@pytest.mark.mqtt311("MQTT-4.4.0-1")
@pytest.mark.mqtt5("MQTT-4.4.0-1")
@pytest.mark.parametrize("version", [5, 4])
def test_a_qos2_delivery_past_pubrec_gets_its_pubrel_again_after_the_restart(brokers, version):
    """[MQTT-4.4.0-1] A session resumed with session present 1 resends its unacknowledged PUBREL packets with
    their packet ids, a restart in between too: a client that delivers a QoS 2 message on PUBREL (paho does)
    otherwise never delivers it, and its packet id stays taken."""
    _, again, packet_id = _pubrel_resent_after_a_restart(brokers, version, "qos2-device", "cmd/qos2")
    again.send_packet(PubComp(packet_id))
    again.recv_none()


def _pubrel_resent_after_a_restart(
    brokers, version: int, client_id: str, topic: str
) -> tuple[Any, RawClient, int]:
    """A persistent session past PUBREC of a QoS 2 delivery on ``topic`` (its PUBCOMP never sent), the broker
    restarted, the client back (session present): the broker, the client, and the packet id its PUBREL was
    sent again with."""
    broker = brokers()
    device = RawClient(broker.port, version)
    device.connect(client_id, clean_start=False, **({"properties": opted_in()} if version == 5 else {}))
    device.subscribe(topic, 2)
    PahoClient(broker.port, "ops").publish(topic, b"exactly once", 2)
    delivery = device.recv()
    assert isinstance(delivery, Publish) and delivery.qos == 2 and delivery.packet_id is not None
    device.send_packet(PubRec(delivery.packet_id))
    assert isinstance(device.recv(), PubRel)  # the broker is past PUBREC: PUBCOMP never comes
    device.close()

    broker = restarted(broker, brokers)
    again = RawClient(broker.port, version)
    ack = again.connect(client_id, clean_start=False, **({"properties": opted_in()} if version == 5 else {}))
    assert isinstance(ack, ConnAck) and ack.session_present
    resent = again.recv()
    assert isinstance(resent, PubRel) and resent.packet_id == delivery.packet_id
    return broker, again, delivery.packet_id


def _persistent_raw(port: int, version: int, client_id: str) -> tuple[RawClient, ConnAck]:
    client = RawClient(port, version)
    fields: dict[str, Any] = {"properties": Properties(session_expiry_interval=300)} if version == 5 else {}
    return client, client.connect(client_id, clean_start=False, **fields)


@pytest.mark.mqtt311("MQTT-4.3.3-2", "MQTT-4.4.0-1")
@pytest.mark.mqtt5("MQTT-4.3.3-10", "MQTT-4.3.3-11", "MQTT-4.4.0-1")
@pytest.mark.parametrize(
    ("version", "ending", "resend"),
    [
        (5, "SIGTERM", "publish"),
        (4, "SIGTERM", "pubrel"),
        (4, "SIGKILL", "publish"),
        (5, "SIGKILL", "pubrel"),
        (5, "SIGKILL", "reused"),
        (5, "SIGKILL", "reused, its PUBREL's line lost"),
    ],
)
def test_an_incoming_qos2_id_held_over_a_restart_is_never_routed_twice(tmp_path, version, ending, resend):
    """[MQTT-4.3.3-10] [MQTT-4.3.3-11] An incoming QoS 2 packet id is held from PUBREC to PUBREL over a
    restart too, a SIGKILL right after the PUBREC included (long after the last snapshot): a publisher that
    resumes its session and resends the PUBLISH with DUP (or only its PUBREL) [MQTT-4.4.0-1] gets PUBREC,
    then PUBCOMP 0, and the message is logged and delivered once, not twice. An id released before the
    crash is free after it [MQTT-4.3.3-2]: a new PUBLISH with it is a new message, also when the line that
    said so was lost (a power cut): a PUBLISH without DUP is not a resend [MQTT-3.3.1-1]."""
    process = BrokerProcess(tmp_path, sessions={"persist_interval_s": 3600}, sys_topics={"enabled": False})
    process.start()
    try:
        subscriber, _ = _persistent_raw(process.port, 5, "reader")
        subscriber.subscribe("in/q2", 2)
        subscriber.close()
        _persistent_raw(process.port, version, "q2-publisher")[0].close()
        process.stop()  # the snapshot has both sessions
        process.start()
        publisher, _ = _persistent_raw(process.port, version, "q2-publisher")
        publisher.send_packet(Publish("in/q2", b"exactly once", 2, packet_id=7))
        assert isinstance(publisher.recv(), PubRec)
        if resend.startswith("reused"):
            publisher.send_packet(PubRel(7))
            assert isinstance(publisher.recv(), PubComp)
        publisher.close()
        if ending == "SIGKILL":
            process.kill()
            process.process.wait()
            if resend.endswith("lost"):
                [journal] = [f for f in (tmp_path / "data" / "meta").glob("qos2-ids.*") if f.stat().st_size]
                lines = journal.read_text().splitlines(keepends=True)
                assert lines[-1].endswith(",0]\n")
                journal.write_text("".join(lines[:-1]))
        else:
            process.stop()
        process.start()
        again, ack = _persistent_raw(process.port, version, "q2-publisher")
        assert ack.session_present
        expected = [b"exactly once"]
        if resend.startswith("reused"):
            again.send_packet(Publish("in/q2", b"the next one", 2, packet_id=7))
            expected.append(b"the next one")
        elif resend == "publish":
            again.send_packet(Publish("in/q2", b"exactly once", 2, dup=True, packet_id=7))
        if resend != "pubrel":
            rec = again.recv()
            assert isinstance(rec, PubRec) and rec.packet_id == 7
        again.send_packet(PubRel(7))
        comp = again.recv()
        assert isinstance(comp, PubComp) and (comp.packet_id, comp.reason_code) == (7, 0)
        reader, _ = _persistent_raw(process.port, 5, "reader")
        delivered, released = [], 0
        while released < len(expected):
            packet = reader.recv()
            if isinstance(packet, Publish) and packet.packet_id is not None:
                delivered.append(packet.payload)
                reader.send_packet(PubRec(packet.packet_id))
            else:
                assert isinstance(packet, PubRel)
                reader.send_packet(PubComp(packet.packet_id))
                released += 1
        reader.recv_none(0.5)
        assert delivered == expected
    finally:
        process.stop()


@pytest.mark.parametrize("version", [5, 4])
def test_a_session_restored_with_a_release_to_resend_takes_new_deliveries(brokers, version):
    """A session restored with the PUBREL of a QoS 2 delivery to resend gets the messages published after
    the restart too: its in-flight window came back without the packet id to try next, so the first new
    delivery raised AttributeError in the routing, and the publisher never got its PUBACK / PUBREC."""
    broker, again, packet_id = _pubrel_resent_after_a_restart(brokers, version, "q2-next", "cmd/next")
    PahoClient(broker.port, "ops-2").publish("cmd/next", b"after the restart", 1)
    fresh = again.recv()
    assert isinstance(fresh, Publish) and fresh.payload == b"after the restart"
    assert fresh.packet_id != packet_id  # still waiting for its PUBCOMP


@pytest.mark.mqtt5("MQTT-4.4.0-1", "MQTT-3.3.1-1")
@pytest.mark.mqtt311("MQTT-4.4.0-1", "MQTT-3.3.1-1")
@pytest.mark.parametrize("version", [5, 4])
def test_a_qos2_delivery_not_yet_pubreced_is_resent_with_its_packet_id_and_dup_after_the_restart(
    tmp_path, version
):
    """[MQTT-4.4.0-1] [MQTT-3.3.1-1] A QoS 2 delivery the client had not answered with PUBREC when the broker
    stopped is resent, after the restart, with its original packet id and DUP 1, as without a restart: a
    client that had it (its PUBREC lost with the connection) takes it as the duplicate it is, where a new
    packet id made it a second message."""
    process = BrokerProcess(tmp_path, sys_topics={"enabled": False})
    process.start()
    try:
        device, _ = _persistent_raw(process.port, version, "q2-subscriber")
        device.subscribe("out/q2", 2)
        publisher = PahoClient(process.port, "ops")
        for payload in (b"first", b"second"):
            publisher.publish("out/q2", payload, 2)
        done = device.recv()
        assert isinstance(done, Publish) and done.packet_id is not None
        device.send_packet(PubRec(done.packet_id))
        in_flight = device.recv()
        assert isinstance(in_flight, Publish) and in_flight.payload == b"second"
        assert isinstance(device.recv(), PubRel)
        device.send_packet(PubComp(done.packet_id))
        device.close()  # "second" delivered, its PUBREC never sent
        process.stop()
        process.start()
        again, ack = _persistent_raw(process.port, version, "q2-subscriber")
        assert ack.session_present
        resent = again.recv()
        assert isinstance(resent, Publish)
        assert (resent.payload, resent.packet_id, resent.dup) == (b"second", in_flight.packet_id, True)
        assert in_flight.packet_id != 1
    finally:
        process.stop()


@pytest.mark.mqtt5("MQTT-4.3.3-11")
def test_qos2_journal_lines_that_name_no_id_are_skipped_and_the_broker_starts(tmp_path):
    """A ``meta/qos2-ids.<n>`` line of valid JSON that is no ``[client, id, held]`` (a number, null, an
    object: a file written by hand or damaged): before, the start failed on it with a TypeError traceback,
    at every start until someone removed the file. Now such lines are skipped, said once at WARNING naming
    the file, and the ids around them are held as before: the publisher's PUBREL gets PUBCOMP 0
    [MQTT-4.3.3-11]."""
    process = BrokerProcess(tmp_path, sessions={"persist_interval_s": 3600}, sys_topics={"enabled": False})
    process.start()
    try:
        _persistent_raw(process.port, 5, "q2-publisher")[0].close()
        process.stop()  # the snapshot has the session
        process.start()
        publisher, _ = _persistent_raw(process.port, 5, "q2-publisher")
        publisher.send_packet(Publish("in/q2", b"exactly once", 2, packet_id=7))
        assert isinstance(publisher.recv(), PubRec)
        publisher.close()
        process.kill()
        [journal] = [f for f in (tmp_path / "data" / "meta").glob("qos2-ids.*") if f.stat().st_size]
        with journal.open("a") as file:
            file.write('5\nnull\n{"dev": 1}\n["q2-publisher", 8, 1]\n')

        process.start()

        again, ack = _persistent_raw(process.port, 5, "q2-publisher")
        assert ack.session_present
        for packet_id in (7, 8):
            again.send_packet(PubRel(packet_id))
            comp = again.recv()
            assert isinstance(comp, PubComp) and (comp.packet_id, comp.reason_code) == (packet_id, 0)
        log = process.log_path.read_text()
        assert "Traceback" not in log
        assert f"{journal}: 3 lines are not incoming QoS 2 ids (damaged): skipped" in log
    finally:
        process.stop()
