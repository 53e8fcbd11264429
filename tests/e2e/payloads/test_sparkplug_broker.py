"""What Sparkplug B asks of an MQTT server, checked with real clients against a Timestone broker.

The edge node is the simulated fleet's (our asyncio client, its NDEATH as its will); the host application
is gmqtt (its STATE birth retained, its STATE death as its will); paho watches as a second host would.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from random import Random

import pytest
from gmqtt import Client as GmqttClient
from gmqtt import Message as GmqttMessage

from pipelines.fleet.sparkplug_node import SparkplugBehaviour, SparkplugEdgeNode
from pipelines.payloads.sparkplug.encode import rebirth_request
from pipelines.payloads.sparkplug.messages import bdseq, read_payload
from pipelines.payloads.sparkplug.topics import state_topic
from tests.e2e.broker_clients import PahoClient

HOST_ID = "scada"


def edge_node(port: int) -> SparkplugEdgeNode:
    """Edge node gw1 of group plant1 with devices pump7 and pump8; it sends data only when a test asks."""
    behaviour = SparkplugBehaviour(data_interval_s=0, keep_alive_s=30)
    devices = ["pump7", "pump8"]
    return SparkplugEdgeNode("plant1", "gw1", devices, ("127.0.0.1", port), behaviour, Random(1), Counter())


async def expect(watcher: PahoClient, count: int) -> list:
    return await asyncio.to_thread(watcher.expect, count)


@pytest.mark.sparkplug(
    "tck-id-conformance-mqtt-will-messages",
    "tck-id-conformance-mqtt-qos0",
    "tck-id-conformance-mqtt-qos1",
    "tck-id-message-flow-edge-node-birth-publish-will-message-topic",
)
def test_an_edge_nodes_death_is_its_will_published_when_it_drops_and_it_comes_back_with_the_next_bdseq(
    broker,
):
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("spBv1.0/#", 1)

    async def scenario() -> None:
        node = edge_node(broker.port)
        await node.start()
        nbirth, *dbirths = await expect(watcher, 3)
        assert (nbirth.topic, nbirth.qos, nbirth.retain) == ("spBv1.0/plant1/NBIRTH/gw1", 0, False)
        assert sorted(m.topic for m in dbirths) == [
            "spBv1.0/plant1/DBIRTH/gw1/pump7",
            "spBv1.0/plant1/DBIRTH/gw1/pump8",
        ]
        born = read_payload(nbirth.payload)
        node.publish_data()
        assert [m.topic.split("/")[2] for m in await expect(watcher, 2)] == ["DDATA", "DDATA"]
        node.go_offline()  # no DISCONNECT: the broker publishes the will
        [death] = await expect(watcher, 1)
        assert (death.topic, death.qos, death.retain) == ("spBv1.0/plant1/NDEATH/gw1", 1, False)
        assert bdseq(read_payload(death.payload)) == bdseq(born) == 0
        await node.start()
        [rebirth] = [m for m in await expect(watcher, 3) if m.topic.endswith("NBIRTH/gw1")]
        assert bdseq(read_payload(rebirth.payload)) == 1 and read_payload(rebirth.payload).seq == 0
        await node.stop()  # a clean stop: the node sends the NDEATH itself, then DISCONNECT
        [goodbye] = await expect(watcher, 1)
        assert goodbye.topic.endswith("NDEATH/gw1") and bdseq(read_payload(goodbye.payload)) == 1
        await asyncio.to_thread(watcher.expect_none, 0.3)  # and no will after the DISCONNECT

    asyncio.run(scenario())


def state(online: bool, timestamp: int) -> bytes:
    return json.dumps({"online": online, "timestamp": timestamp}).encode()


@pytest.mark.sparkplug(
    "tck-id-conformance-mqtt-retained",
    "tck-id-conformance-mqtt-will-messages",
    "tck-id-conformance-mqtt-qos1",
    "tck-id-host-topic-phid-birth-retain",
    "tck-id-host-topic-phid-death-retain",
    "tck-id-operational-behavior-host-application-connect-will-retained",
)
def test_a_host_applications_retained_state_is_what_a_late_edge_node_reads_and_its_will_replaces_it(broker):
    connected_at = int(time.time() * 1000)
    topic = state_topic(HOST_ID)

    async def host_online() -> GmqttClient:
        host = GmqttClient(
            "scada-host", will_message=GmqttMessage(topic, state(False, connected_at), qos=1, retain=True)
        )
        await host.connect("127.0.0.1", broker.port, keepalive=30)
        host.publish(topic, state(True, connected_at), qos=1, retain=True)
        await asyncio.sleep(0)  # the PUBLISH is written; its PUBACK follows
        return host

    async def scenario() -> None:
        host = await host_online()
        early = PahoClient(broker.port, "early-node")
        early.subscribe(topic, 1)
        [online] = await expect(early, 1)
        assert (online.retain, online.qos, json.loads(online.payload)) == (
            True,
            1,
            {"online": True, "timestamp": connected_at},
        )
        host._connection._transport.abort()  # the host's process dies: no DISCONNECT
        [offline] = await expect(early, 1)
        assert json.loads(offline.payload) == {"online": False, "timestamp": connected_at}
        late = PahoClient(broker.port, "late-node")
        late.subscribe(topic, 1)
        [kept] = await expect(late, 1)
        assert kept.retain and json.loads(kept.payload)["online"] is False  # the will replaced the birth

    asyncio.run(scenario())


def test_a_rebirth_request_brings_the_births_again_on_the_same_connection(broker):
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("spBv1.0/plant1/+/gw1/#", 0)
    host = PahoClient(broker.port, "host")

    async def scenario() -> None:
        node = edge_node(broker.port)
        await node.start()
        await expect(watcher, 3)
        node.publish_data()
        await expect(watcher, 2)
        request = rebirth_request(int(time.time() * 1000))
        assert read_payload(request).seq is None and read_payload(request).timestamp is not None
        host.publish("spBv1.0/plant1/NCMD/gw1", request, 0, retain=False)
        births = await expect(watcher, 4)  # the command itself, then the births
        assert [m.topic.split("/")[2] for m in births] == ["NCMD", "NBIRTH", "DBIRTH", "DBIRTH"]
        again = read_payload(births[1].payload)
        assert (again.seq, bdseq(again)) == (0, 0)  # sequence from 0, same connection, same bdSeq
        assert node.stats["sparkplug_rebirth_requests"] == 1
        await node.stop()

    asyncio.run(scenario())
