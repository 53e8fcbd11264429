"""A broker killed with SIGKILL while clients publish keeps every acknowledged message, once and in order.

The broker runs as its own process (`timestone broker --config`). Four publishers (two lean MQTT 5
clients, paho MQTT 5 and paho MQTT 3.1.1) number their QoS 1 messages on one shared topic and record
which ones were PUBACKed. The broker is killed mid-stream, started again on the same data, and the log is
read back through the offsets API: every acknowledged message must be there exactly once, each
publisher's messages in the order it sent them; unacknowledged ones may or may not be there, but never
twice and never out of order.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from pathlib import Path

import paho.mqtt.client as mqtt

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess
from pipelines.fleet.client import MqttClient
from tests.e2e.broker_clients import PahoClient, wait_for
from tests.e2e.commitlog.e2e_helpers import LoopThread, read_log

TOPIC = "crash/plant-1"
IN_FLIGHT = 16
ACKED_BEFORE_KILL = 300


class LeanPublisher:
    """Publishes `name:<seq>` with up to IN_FLIGHT unacknowledged, until the connection dies."""

    def __init__(self, name: str, port: int, loop: LoopThread) -> None:
        self.name = name
        self.acked: list[int] = []
        self._client: MqttClient = loop.run(MqttClient.connect("127.0.0.1", port, name))
        self.task = asyncio.run_coroutine_threadsafe(self._publish_until_cut(), loop.loop)

    async def _publish_until_cut(self) -> None:
        slots = asyncio.Semaphore(IN_FLIGHT)
        failed = asyncio.Event()

        async def one(seq: int) -> None:
            try:
                reason_code = await self._client.publish(TOPIC, f"{self.name}:{seq}".encode(), 1)
                if reason_code < 0x80:  # a v5 PUBACK with an error code (a failed append) is a refusal
                    self.acked.append(seq)
            except (ConnectionError, OSError):
                failed.set()
            finally:
                slots.release()

        seq = 0
        pending: set[asyncio.Task] = set()
        while not failed.is_set():
            await slots.acquire()
            if failed.is_set() or not self._client.connected:
                break
            task = asyncio.ensure_future(one(seq))
            pending.add(task)
            task.add_done_callback(pending.discard)
            seq += 1
        await asyncio.gather(*pending, return_exceptions=True)


class PahoPublisher:
    """The same with paho (its own in-flight window of 20); acks read back from each message's info."""

    def __init__(self, name: str, port: int, version: int) -> None:
        self.name = name
        self._client = PahoClient(port, name, version=version)
        self._infos: list[mqtt.MQTTMessageInfo] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._publish, daemon=True)
        self._thread.start()

    def _publish(self) -> None:
        seq = 0
        while not self._stop.is_set() and seq < 50_000:
            if seq - self.acked_count() > 200:  # keep paho's own queue short
                time.sleep(0.001)
                continue
            info = self._client.client.publish(TOPIC, f"{self.name}:{seq}", 1)
            if info.rc != mqtt.MQTT_ERR_SUCCESS and info.rc != mqtt.MQTT_ERR_NO_CONN:
                break
            self._infos.append(info)
            seq += 1

    def acked_count(self) -> int:
        return sum(1 for info in list(self._infos) if info.is_published())

    @property
    def acked(self) -> list[int]:
        return [seq for seq, info in enumerate(list(self._infos)) if info.is_published()]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._client.close()


def test_sigkill_keeps_every_acknowledged_message_once_and_in_order(tmp_path: Path):
    broker = BrokerProcess(tmp_path, limits={"messages_per_second_per_client": 0}).start()
    loop = LoopThread()
    try:
        lean = [LeanPublisher(f"lean-{n}", broker.port, loop) for n in range(2)]
        paho = [PahoPublisher("paho-v5", broker.port, 5), PahoPublisher("paho-v311", broker.port, 4)]
        everyone_acked = wait_for(
            lambda: min([len(p.acked) for p in lean] + [p.acked_count() for p in paho]) >= ACKED_BEFORE_KILL,
            timeout=30,
        )
        broker.kill()  # mid-stream: every publisher has messages in flight
        for publisher in lean:
            publisher.task.result(timeout=10)
        acked = {p.name: sorted(p.acked) for p in lean}
        for paho_publisher in paho:
            paho_publisher.stop()
            acked[paho_publisher.name] = paho_publisher.acked

        broker.start()
        with OffsetsClient(broker.offsets_url, retry_backoff_s=0.2) as client:
            rows = read_log(client, TOPIC)
            info = client.log_info(TOPIC)
    finally:
        loop.close()
        broker.stop()

    assert everyone_acked
    assert [row["offset"] for row in rows] == list(range(info.start_offset, info.end_offset))
    assert info.start_offset == 0
    in_log: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        name, seq = row["payload"].decode().split(":")
        in_log[name].append(int(seq))
        assert row["client_id"] == name
    for name, seqs in acked.items():
        logged = in_log[name]
        assert logged == sorted(set(logged)), f"{name}: duplicated or out of order"
        missing = set(seqs) - set(logged)
        assert not missing, f"{name}: acknowledged but lost: {sorted(missing)[:10]}"
        assert len(seqs) >= ACKED_BEFORE_KILL
    assert "unclean" in broker.log_path.read_text()  # the restart was a recovery, not a clean open
