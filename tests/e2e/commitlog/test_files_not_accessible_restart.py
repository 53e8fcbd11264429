"""A data directory whose files the broker may not open (a backup restored as root, a wrong mode) is not
damage. Run as an unprivileged user (``setpriv``): killed with SIGKILL, so that its active segment is opened
for writing at the next start, whose file is then made root's with mode 0600, the start stops with one line
naming the file and the fix, moves nothing and sets nothing aside, and once the owner is right again every
record is served; stopped cleanly, a sealed segment made unreadable while a device replays it keeps that
device connected, its other topics served, and the replay goes on once the file can be read.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.protocol.packets import PubAck, Publish
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, RawClient, wait_for
from tests.e2e.commitlog.e2e_helpers import health, read_log, replay_from
from tests.unit.broker_edge.storage.log_helpers import partition_segments

NOBODY = 65534
DEVICES = 20

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run as another user",
)


@contextlib.contextmanager
def broker_as_nobody(**sections: Any) -> Iterator[BrokerProcess]:
    """A broker run as nobody, over a directory of nobody's (outside pytest's root-only temporary tree)."""
    base = Path(tempfile.mkdtemp(prefix="timestone-owner-"))
    broker = BrokerProcess(base, limits={"messages_per_second_per_client": 0}, **sections)
    broker.wrapper = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    os.chmod(base, 0o755)
    os.chown(base, NOBODY, NOBODY)
    try:
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def unprivileged() -> Iterator[BrokerProcess]:
    with broker_as_nobody() as broker:
        yield broker


def test_a_segment_the_broker_may_not_open_stops_the_start_and_sets_nothing_aside(unprivileged):
    broker = unprivileged.start()
    publisher = PahoClient(broker.port, "gateway")
    for device in range(DEVICES):
        publisher.publish(f"fleet/dev-{device}/t", f"m{device}", 1)
    publisher.close()
    broker.kill()
    data = broker.directory / "data"
    active = partition_segments(data)[-1]
    os.chown(active, 0, 0)
    os.chmod(active, 0o600)

    with pytest.raises(RuntimeError, match="did not start"):
        broker.start(timeout_s=10)

    assert broker.process is not None and broker.process.returncode == 1
    text = broker.log_path.read_text()
    assert f"cannot start: [Errno 13] partition 0 cannot be opened: {active}: Permission denied" in text
    assert not [name for name in os.listdir(data / "log") if "quarantined" in name]  # nothing moved
    assert not (data / "meta" / "quarantine.json").exists()  # nothing set aside

    os.chown(active, NOBODY, NOBODY)  # the owner put right
    broker.start()
    with OffsetsClient(broker.offsets_url) as client:
        for device in range(DEVICES):
            rows = client.fetch(f"fleet/dev-{device}/t", 0).data.to_pylist()
            assert [row["payload"] for row in rows] == [f"m{device}".encode()]


def test_a_device_replaying_a_segment_that_cannot_be_read_keeps_its_connection_and_gets_it_once_readable(
    unprivileged,
):
    """A sealed segment that cannot be read while the broker runs (its owner wrong, or EIO): a device
    replaying it is not disconnected over and over; its other subscriptions are served, and the replay goes
    on, in order, once the file can be read."""
    broker = unprivileged.start()
    publisher = PahoClient(broker.port, "gateway")
    for number in range(5):
        publisher.publish("fleet/dev-1/t", f"m{number}", 1)
    broker.stop()  # clean: the segment is sealed, and read only when a reader needs it
    sealed = partition_segments(broker.directory / "data")[-1]
    os.chown(sealed, 0, 0)
    os.chmod(sealed, 0o600)
    broker.start()
    publisher = PahoClient(broker.port, "gateway")

    device = PahoClient(broker.port, "dev-1", clean=False, session_expiry=300)
    device.subscribe("fleet/dev-1/cmd", 1)
    device.subscribe("fleet/dev-1/t", 1, properties=replay_from("0"))
    publisher.publish("fleet/dev-1/cmd", "still served", 1)
    assert [m.payload for m in device.expect(1)] == [b"still served"]  # connected, other topics served
    assert "fleet/dev-1/t" in broker.log_path.read_text()  # said, naming the log

    os.chown(sealed, NOBODY, NOBODY)  # the owner put right while it runs
    publisher.publish("fleet/dev-1/t", "m5", 1)
    got = device.expect(6, timeout=10)
    assert [m.payload for m in got] == [f"m{n}".encode() for n in range(6)]


def test_the_offsets_api_over_a_segment_that_cannot_be_read_answers_503_and_serves_it_once_readable(
    unprivileged,
):
    """A reader of the offsets API (the Spark source) asking for records in a segment the broker cannot read
    gets 503 ``log_unreadable`` with ``Retry-After`` (the client retries it), naming the log, not a 500 with
    a traceback logged at every request; once the file can be read, the same request gets every record."""
    broker = unprivileged.start()
    publisher = PahoClient(broker.port, "gateway")
    for number in range(5):
        publisher.publish("fleet/dev-1/t", f"m{number}", 1)
    broker.stop()
    sealed = partition_segments(broker.directory / "data")[-1]
    os.chown(sealed, 0, 0)
    os.chmod(sealed, 0o600)
    broker.start()
    url = f"{broker.offsets_url}/v1/logs/fleet%2Fdev-1%2Ft/records?offset=0&format=jsonl"

    answers = []
    for _ in range(3):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        answers.append((refused.value.code, refused.value.headers["Retry-After"], json.load(refused.value)))
    assert [(status, retry) for status, retry, _ in answers] == [(503, "1")] * 3
    assert answers[0][2]["error"] == "log_unreadable" and answers[0][2]["topic"] == "fleet/dev-1/t"
    logged = broker.log_path.read_text()
    assert "Traceback" not in logged
    assert logged.count("cannot read") == 1, logged  # said once, naming the file, not at every request

    os.chown(sealed, NOBODY, NOBODY)
    records = OffsetsClient(broker.offsets_url).fetch_records("fleet/dev-1/t", 0).data
    assert [record.payload for record in records] == [f"m{n}".encode() for n in range(5)]


def _publish_qos1(broker: BrokerProcess, topic: str, payloads: list[bytes]) -> list[int]:
    """Each payload published at QoS 1 by a v5 client, in order; the reason code of each PUBACK (below 0x80:
    acknowledged, 0x10 when no one subscribes)."""
    client = RawClient(broker.port, 5)
    client.connect("gateway")
    codes = []
    for number, payload in enumerate(payloads, 1):
        client.send_packet(Publish(topic, payload, 1, packet_id=number))
        answer = client.recv()
        assert isinstance(answer, PubAck)
        codes.append(answer.reason_code)
    client.close()
    return codes


def test_a_partition_directory_made_read_only_under_the_broker_refuses_for_now_and_takes_appends_again():
    """The partition's directory made read-only while the broker runs (a wrong ``chmod``, a restore), so the
    next segment cannot be created: before, that was a failed store for the life of the process, every QoS 1
    publish refused (0x80) even once the mode was put right, until a restart. Now the publishes are refused
    while it lasts (0x80, the reason said once at WARNING, ``/health`` naming it), and once the directory can
    be written again the broker takes them again without a restart, nothing acknowledged lost, no gap."""
    with broker_as_nobody(storage={"segment_bytes": 4096}) as broker:
        broker.start()
        partition = broker.directory / "data" / "log" / "00"
        payloads = [b"%04d" % number + b"x" * 500 for number in range(40)]
        before = _publish_qos1(broker, "t", payloads[:4])
        assert max(before) < 0x80
        os.chmod(partition, 0o555)

        during = _publish_qos1(broker, "t", payloads[4:30])

        assert during[-1] == 0x80  # the segment is full long before: its roll cannot make the next one
        assert health(broker)["log_shortage"] == "not_writable"
        os.chmod(partition, 0o755)
        assert wait_for(lambda: _publish_qos1(broker, "t", payloads[30:31])[0] < 0x80, timeout=20)
        assert max(_publish_qos1(broker, "t", payloads[31:])) < 0x80
        acknowledged = [p for p, code in zip(payloads[:30], before + during, strict=True) if code < 0x80]
        acknowledged += payloads[30:]
        with OffsetsClient(broker.offsets_url) as client:
            stored = [row["payload"] for row in read_log(client, "t")]
        assert [p for p in stored if p in acknowledged] == acknowledged  # every one, in order
        text = broker.log_path.read_text()
        assert "no write access to storage.directory writing the log (Permission denied)" in text
        assert "the log is written, appends are taken again" in text
        broker.stop()
        assert broker.process is not None and broker.process.returncode == 0
