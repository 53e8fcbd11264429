"""Helpers of the end-to-end commitlog proofs: offsets on deliveries, replay properties, reading a log."""

from __future__ import annotations

import json
import urllib.request
from typing import Any, Literal

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from broker_edge.engine.message import OFFSETS_OPT_IN
from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.protocol.properties import Properties
from pipelines import loop_thread
from tests.e2e.broker_clients import PahoClient
from tests.e2e.conftest import RunningBroker

OPTED_IN = {"UserProperty": [OFFSETS_OPT_IN]}
"""paho CONNECT properties (``PahoClient(connect_properties=...)``) asking for ``offset`` on deliveries."""


def opted_in(session_expiry_s: int = 300) -> Properties:
    """CONNECT properties of a raw client with a persistent session that asks for the ``offset`` property."""
    return Properties(session_expiry_interval=session_expiry_s, user_properties=[OFFSETS_OPT_IN])


def offset_of(message: Any) -> int:
    """The log offset a v5 delivery carries (paho message)."""
    return int(dict(message.properties.UserProperty)["offset"])


def replay_from(start: str) -> PahoProperties:
    """SUBSCRIBE properties asking to read the log from `start` (a number, earliest, latest, time:<ms>)."""
    props = PahoProperties(PacketTypes.SUBSCRIBE)
    props.UserProperty = [("offset", start)]
    return props


def publish_numbered(
    broker: RunningBroker, topic: str, count: int, first: int = 0, client_id: str = ""
) -> None:
    """Publish payloads `str(first)` .. `str(first + count - 1)` at QoS 1, each acknowledged."""
    publisher = PahoClient(broker.port, client_id or f"numbered-{topic}")
    for number in range(first, first + count):
        publisher.publish(topic, str(number), 1)
    publisher.disconnect()


def offsets_client(broker: RunningBroker, **options: Any) -> OffsetsClient:
    """A client of the broker's own offsets API."""
    return OffsetsClient(f"http://127.0.0.1:{broker.broker.offsets_port}", **options)


def read_log(client: OffsetsClient, topic: str) -> list[dict]:
    """Every record of `topic` as the offsets API serves it (Arrow rows), from the start to the end."""
    rows: list[dict] = []
    offset: int | Literal["earliest"] = "earliest"
    while True:
        fetched = client.fetch(topic, offset, max_records=5000)
        rows += fetched.data.to_pylist()
        if fetched.next_offset >= fetched.end_offset:
            return rows
        offset = fetched.next_offset


class LoopThread(loop_thread.LoopThread):
    """An asyncio loop on its own thread, started at once, for clients written with asyncio (the lean
    client, gmqtt)."""

    def __init__(self) -> None:
        super().__init__("test-clients")
        self.start()


def health(broker: Any) -> dict:
    """The broker's ``/health`` report (a ``BrokerProcess``: its admin port)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.admin_port}/health", timeout=10) as answer:
        return json.loads(answer.read())
