"""A clean stop completes on a full disk: SIGTERM exits 0, what could not be written is logged, and the next
start (with room again) serves every acknowledged message. The data directory is a small tmpfs, filled."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.protocol.packets import PubAck, Publish
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient, RawClient, close_all
from tests.e2e.commitlog.e2e_helpers import read_log

PAYLOAD = b"r" * 2000


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (root is needed to mount it)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path) -> None:
    """Take every byte left on the filesystem of ``path`` (it may be full already)."""
    try:
        with open(path, "wb") as filler:
            while True:
                filler.write(b"\0" * 4096)
                filler.flush()
    except OSError:
        pass


def test_a_stop_on_a_full_disk_completes_and_the_next_start_keeps_every_acknowledged_message(
    tmp_path, small_disk
):
    data = small_disk / "data"
    broker = BrokerProcess(tmp_path / "broker", storage={"directory": str(data)}).start()
    acknowledged = []
    try:
        device = RawClient(broker.port, version=5)
        assert device.connect("meter-1").reason_code == 0
        # a session to save at stop
        subscriber = PahoClient(broker.port, "dashboard", clean=False, session_expiry=3600)
        assert subscriber.subscribe("site/#", 1) == [1]
        for number in range(2000):
            device.send_packet(Publish("site/meter/1", str(number).encode() + PAYLOAD, 1, packet_id=1))
            ack = device.recv()
            assert isinstance(ack, PubAck), ack
            if ack.reason_code >= 0x80:  # the disk is full: refused, not lost
                break
            acknowledged.append(number)
        else:
            pytest.fail("the disk never filled")
        fill(small_disk / "filler")
        assert broker.process is not None
        close_all()
        broker.process.terminate()
        assert broker.process.wait(timeout=30) == 0  # the stop completed
    finally:
        close_all()
        broker.stop()
    log = broker.log_path.read_text()
    assert "broker stopped" in log
    assert "cannot start" not in log and "Traceback" not in log
    assert "No space left on device" in log  # what could not be written is said

    (small_disk / "filler").unlink(missing_ok=True)
    broker.start()  # the same config and directory, a byte or two free again
    try:
        with OffsetsClient(broker.offsets_url) as reader:
            stored = [row["payload"] for row in read_log(reader, "site/meter/1")]
        assert acknowledged, "something was acknowledged before the disk filled"
        assert [int(p[: -len(PAYLOAD)]) for p in stored] == acknowledged
    finally:
        broker.stop()
    after = broker.log_path.read_text()[len(log) :]
    assert "after an unclean shutdown" in after  # the start says why it checked the logs


def test_a_first_start_on_a_full_disk_stops_naming_the_file_and_starts_once_there_is_room(
    tmp_path, small_disk
):
    """A new data directory on a disk already full: the start stops (exit 1) in one line naming the file it
    could not write, not a bare ``[Errno 28] No space left on device`` that names nothing; once space is freed
    the same command starts and serves."""
    fill(small_disk / "filler")
    broker = BrokerProcess(tmp_path / "broker", storage={"directory": str(small_disk / "data")})

    with pytest.raises(RuntimeError, match="did not start"):
        broker.start(timeout_s=20)

    assert broker.process is not None and broker.process.returncode == 1
    lines = [line for line in broker.log_path.read_text().splitlines() if "cannot start" in line]
    layout = small_disk / "data" / "meta" / "LAYOUT.tmp"
    assert len(lines) == 1 and lines[0].endswith(
        f"cannot start: [Errno 28] No space left on device: '{layout}'"
    )
    (small_disk / "filler").unlink()
    broker.start()
    try:
        device = RawClient(broker.port, version=5)
        assert device.connect("meter-1").reason_code == 0
        device.send_packet(Publish("site/meter/1", PAYLOAD, 1, packet_id=1))
        ack = device.recv()
        assert isinstance(ack, PubAck) and ack.reason_code < 0x80
    finally:
        close_all()
        broker.stop()
