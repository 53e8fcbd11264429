"""``timestone sparkplug-host`` against a Timestone broker: the STATE edge nodes wait for, and rebirths.

paho watches the STATE topic as an edge node configured with this primary host would; the edge node is the
simulated fleet's.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from broker_edge.runtime.local_pki import LocalPki
from broker_edge.security.auth import PasswordFile
from pipelines.cli import main
from pipelines.payloads.sparkplug.encode import MetricOut, bdseq_metric, encode, ndeath
from pipelines.payloads.sparkplug.messages import read_payload
from pipelines.payloads.sparkplug.schema import payload_class
from pipelines.sparkplug_host.cli import build_parser, host_of
from pipelines.sparkplug_host.host import SparkplugHost
from tests.e2e.broker_clients import PahoClient
from tests.e2e.payloads.test_sparkplug_broker import edge_node, expect
from tests.e2e.port_keeper import PortKeeper

TOPIC = "spBv1.0/STATE/timestone"


def host(port: int) -> SparkplugHost:
    return SparkplugHost("127.0.0.1", port, "timestone", rebirth_interval_s=60)


@pytest.mark.sparkplug(
    "tck-id-intro-sparkplug-host-state",
    "tck-id-components-ph-state",
    "tck-id-conformance-primary-host",
    "tck-id-principles-birth-certificates-order",
    "tck-id-host-topic-phid-birth-message",
    "tck-id-host-topic-phid-birth-qos",
    "tck-id-host-topic-phid-birth-retain",
    "tck-id-host-topic-phid-birth-topic",
    "tck-id-host-topic-phid-birth-sub-required",
    "tck-id-host-topic-phid-birth-required",
    "tck-id-host-topic-phid-birth-payload",
    "tck-id-host-topic-phid-birth-payload-timestamp",
    "tck-id-host-topic-phid-death-qos",
    "tck-id-host-topic-phid-death-retain",
    "tck-id-host-topic-phid-death-topic",
    "tck-id-host-topic-phid-death-required",
    "tck-id-host-topic-phid-death-payload",
    "tck-id-host-topic-phid-death-payload-timestamp-disconnect-with-no-disconnect-packet",
    "tck-id-message-flow-phid-sparkplug-clean-session-50",
    "tck-id-message-flow-phid-sparkplug-subscription",
    "tck-id-message-flow-phid-sparkplug-state-publish",
    "tck-id-message-flow-phid-sparkplug-state-publish-payload",
    "tck-id-message-flow-phid-sparkplug-state-publish-payload-timestamp",
    "tck-id-operational-behavior-host-application-connect-will",
    "tck-id-operational-behavior-host-application-connect-will-topic",
    "tck-id-operational-behavior-host-application-connect-will-payload",
    "tck-id-operational-behavior-host-application-connect-will-qos",
    "tck-id-operational-behavior-host-application-connect-will-retained",
    "tck-id-operational-behavior-host-application-connect-birth",
    "tck-id-operational-behavior-host-application-connect-birth-topic",
    "tck-id-operational-behavior-host-application-connect-birth-payload",
    "tck-id-operational-behavior-host-application-connect-birth-qos",
    "tck-id-operational-behavior-host-application-connect-birth-retained",
    "tck-id-payloads-state-will-message",
    "tck-id-payloads-state-will-message-qos",
    "tck-id-payloads-state-will-message-retain",
    "tck-id-payloads-state-will-message-payload",
    "tck-id-payloads-state-subscribe",
    "tck-id-payloads-state-birth",
    "tck-id-payloads-state-birth-payload",
    "tck-id-operational-behavior-primary-application-state-with-multiple-servers-state",
)
def test_the_host_is_online_by_its_retained_birth_and_offline_by_its_will(broker):
    watcher = PahoClient(broker.port, "edge-node-watching")
    watcher.subscribe(TOPIC, 1)

    async def scenario() -> None:
        sparkplug = host(broker.port)
        await sparkplug.start()
        [birth] = await expect(watcher, 1)
        assert (birth.topic, birth.qos) == (TOPIC, 1)
        assert json.loads(birth.payload.decode("utf-8")) == {
            "online": True,
            "timestamp": sparkplug.connected_ms,
        }
        connection = broker.connection("sparkplug-host-timestone")
        will, expiry = broker.call(lambda: (connection.will, connection.session.expiry_interval))
        assert expiry == 0  # clean start, no session kept after the connection
        assert (will.topic, will.qos, will.retain) == (TOPIC, 1, True)
        assert json.loads(will.payload) == {"online": False, "timestamp": sparkplug.connected_ms}
        late = PahoClient(broker.port, "late-node")
        late.subscribe(TOPIC, 1)
        [retained] = await expect(late, 1)
        assert retained.retain and json.loads(retained.payload)["online"] is True
        assert sparkplug.client is not None
        sparkplug.client.abort()  # the host's process dies
        [death] = await expect(watcher, 1)
        assert json.loads(death.payload) == {"online": False, "timestamp": sparkplug.connected_ms}
        assert death.qos == 1
        after = PahoClient(broker.port, "after-node")
        after.subscribe(TOPIC, 1)
        [kept] = await expect(after, 1)
        assert kept.retain and json.loads(kept.payload)["online"] is False

    asyncio.run(scenario())


@pytest.mark.sparkplug(
    "tck-id-operational-behavior-host-application-termination",
    "tck-id-operational-behavior-host-application-death-topic",
    "tck-id-operational-behavior-host-application-death-payload",
    "tck-id-operational-behavior-host-application-death-qos",
    "tck-id-operational-behavior-host-application-death-retained",
    "tck-id-operational-behavior-host-application-disconnect-intentional",
    "tck-id-host-topic-phid-death-payload-timestamp-disconnect-clean",
    "tck-id-message-flow-hid-sparkplug-state-message-delivered",
)
def test_a_stray_offline_state_is_answered_and_a_clean_stop_publishes_the_death(broker):
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe(TOPIC, 1)
    stray = PahoClient(broker.port, "stray")

    async def scenario() -> None:
        sparkplug = host(broker.port)
        await sparkplug.start()
        await expect(watcher, 1)
        stray.publish(TOPIC, json.dumps({"online": False, "timestamp": 1}), 1, retain=True)
        offline, online = await expect(watcher, 2)
        assert json.loads(offline.payload)["online"] is False
        assert json.loads(online.payload) == {"online": True, "timestamp": sparkplug.connected_ms}
        await sparkplug.stop()
        [death] = await expect(watcher, 1)
        assert (death.qos, json.loads(death.payload)) == (
            1,
            {"online": False, "timestamp": sparkplug.connected_ms},
        )
        await asyncio.to_thread(watcher.expect_none, 0.3)  # DISCONNECT followed: no will on top

    asyncio.run(scenario())


@pytest.mark.sparkplug(
    "tck-id-operational-behavior-data-commands-ncmd-rebirth-verb",
    "tck-id-operational-behavior-data-commands-ncmd-rebirth-name",
    "tck-id-operational-behavior-data-commands-ncmd-rebirth-value",
    "tck-id-operational-behavior-data-commands-ncmd-verb",
    "tck-id-operational-behavior-data-commands-ncmd-metric-name",
    "tck-id-operational-behavior-data-commands-ncmd-metric-value",
    "tck-id-topics-ncmd-topic",
    "tck-id-topics-ncmd-mqtt",
    "tck-id-topics-ncmd-timestamp",
    "tck-id-topics-ncmd-payload",
    "tck-id-payloads-ncmd-timestamp",
    "tck-id-payloads-ncmd-seq",
    "tck-id-payloads-ncmd-qos",
    "tck-id-payloads-ncmd-retain",
)
def test_data_from_a_node_whose_birth_the_host_missed_brings_one_rebirth_request(broker):
    commands = PahoClient(broker.port, "commands")
    commands.subscribe("spBv1.0/+/NCMD/#", 1)
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe("spBv1.0/plant1/+/gw1/#", 0)

    async def scenario() -> None:
        node = edge_node(broker.port)
        await node.start()  # born before the host connected: the host has not seen it
        await expect(watcher, 3)
        sparkplug = host(broker.port)
        await sparkplug.start()
        node.publish_data()
        node.publish_data()  # two messages, one request
        [request] = await expect(commands, 1)
        assert (request.topic, request.qos, request.retain) == ("spBv1.0/plant1/NCMD/gw1", 0, False)
        command = read_payload(request.payload)
        assert command.seq is None and command.timestamp is not None
        assert [(m.name, m.datatype, m.message.boolean_value) for m in command.metrics] == [
            ("Node Control/Rebirth", "Boolean", True)
        ]
        messages = await expect(watcher, 8)  # 4 DDATA, the NCMD, then the births again
        assert [m.topic.split("/")[2] for m in messages[-3:]] == ["NBIRTH", "DBIRTH", "DBIRTH"]
        node.publish_data()
        await expect(watcher, 2)
        await asyncio.to_thread(commands.expect_none, 0.3)  # born now: no further request
        assert sparkplug.stats["rebirth_requests"] == 1
        await node.stop()
        await sparkplug.stop()

    asyncio.run(scenario())


@pytest.mark.sparkplug(
    "tck-id-operational-behavior-host-application-termination",
    "tck-id-operational-behavior-host-application-death-retained",
)
def test_a_stop_while_answering_a_stray_offline_state_leaves_the_death_retained(broker):
    stray = PahoClient(broker.port, "stray")

    async def scenario() -> None:
        sparkplug = host(broker.port)
        await sparkplug.start()
        stray.publish(TOPIC, json.dumps({"online": False, "timestamp": 1}), 1, retain=True)
        while not sparkplug.stats["offline_states_answered"]:  # the answer is on its way
            await asyncio.sleep(0.001)
        await sparkplug.stop()

    asyncio.run(scenario())
    late = PahoClient(broker.port, "late")
    late.subscribe(TOPIC, 1)
    [retained] = [late.messages.get(timeout=5)]
    assert json.loads(retained.payload)["online"] is False
    late.expect_none(0.3)


@pytest.mark.sparkplug("tck-id-operational-behavior-edge-node-termination-host-action-ndeath-node-offline")
def test_a_stale_ndeath_does_not_end_the_birth_in_force_and_brings_no_rebirth_request(broker):
    commands = PahoClient(broker.port, "commands")
    commands.subscribe("spBv1.0/+/NCMD/#", 1)
    node = PahoClient(broker.port, "gw9")
    nbirth = encode([bdseq_metric(4), MetricOut(1.5, "Double", name="t", alias=1)], timestamp_ms=1, seq=0)
    ndata = encode([MetricOut(2.5, "Double", alias=1, with_datatype=False)], timestamp_ms=2, seq=1)

    async def scenario() -> None:
        sparkplug = host(broker.port)
        await sparkplug.start()
        node.publish("spBv1.0/plant1/NBIRTH/gw9", nbirth, 1)
        node.publish("spBv1.0/plant1/NDEATH/gw9", ndeath(3), 1)  # an earlier connection's will, late
        node.publish("spBv1.0/plant1/NDATA/gw9", ndata, 1)
        await asyncio.to_thread(commands.expect_none, 0.5)  # the birth with bdSeq 4 is still in force
        node.publish("spBv1.0/plant1/NDEATH/gw9", ndeath(4), 1)  # its own death ends it
        node.publish("spBv1.0/plant1/NDATA/gw9", ndata, 1)
        [request] = await expect(commands, 1)
        assert request.topic == "spBv1.0/plant1/NCMD/gw9"
        assert sparkplug.stats["rebirth_requests"] == 1
        await sparkplug.stop()

    asyncio.run(scenario())


@pytest.mark.sparkplug("tck-id-host-topic-phid-birth-payload-timestamp")
def test_the_host_connects_again_after_a_broker_restart_with_a_new_birth(start_broker):
    first = start_broker()
    port = first.port

    async def scenario() -> None:
        sparkplug = SparkplugHost("127.0.0.1", port, "timestone", rebirth_interval_s=60, retry_s=0.05)
        stop = asyncio.Event()
        await sparkplug.start()
        running = asyncio.create_task(sparkplug.run(stop))
        connected_ms = sparkplug.connected_ms
        await asyncio.to_thread(first.stop)
        second = await asyncio.to_thread(
            start_broker, listeners=[{"name": "tcp", "type": "tcp", "host": "127.0.0.1", "port": port}]
        )
        watcher = PahoClient(second.port, "edge-node-watching")
        watcher.subscribe(TOPIC, 1)
        [birth] = await expect(watcher, 1)  # retained by the new broker: the host is back
        state = json.loads(birth.payload)
        assert state["online"] is True and state["timestamp"] > connected_ms
        assert state["timestamp"] == sparkplug.connected_ms
        stop.set()
        await running
        [death] = await expect(watcher, 1)
        assert json.loads(death.payload) == {"online": False, "timestamp": sparkplug.connected_ms}

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_second_host_with_the_same_id_takes_over_and_the_first_stops_without_reconnecting(broker):
    watcher = PahoClient(broker.port, "edge-node-watching")
    watcher.subscribe(TOPIC, 1)

    async def scenario() -> None:
        first = SparkplugHost("127.0.0.1", broker.port, "timestone", retry_s=0.05)
        await first.start()
        running = asyncio.create_task(first.run(asyncio.Event()))
        await expect(watcher, 1)
        second = SparkplugHost("127.0.0.1", broker.port, "timestone", retry_s=0.05)
        await second.start()
        assert await asyncio.wait_for(running, 10) is False  # taken over: it does not connect again
        states = [json.loads(m.payload) for m in await expect(watcher, 2)]
        assert states == [  # the first one's will, then the second's birth
            {"online": False, "timestamp": first.connected_ms},
            {"online": True, "timestamp": second.connected_ms},
        ]
        await asyncio.to_thread(watcher.expect_none, 0.3)
        assert first.stats["reconnections"] == 0
        await second.stop()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def node_birth(at_ms: int) -> bytes:
    """An NBIRTH sent at ``at_ms``: a rebirth is another message, a copy of a birth the same bytes."""
    return encode([bdseq_metric(4), MetricOut(1.5, "Double", name="t", alias=1)], timestamp_ms=at_ms, seq=0)


NODE_BIRTH = node_birth(1)
DEVICE_BIRTH = encode([MetricOut(7.0, "Double", name="rpm", alias=2)], timestamp_ms=2, seq=1)
DEVICE_DATA = encode([MetricOut(8.0, "Double", alias=2, with_datatype=False)], timestamp_ms=3, seq=2)
DEVICE_DEATH = encode([], timestamp_ms=4, seq=3)


@pytest.mark.sparkplug("tck-id-operational-behavior-edge-node-termination-host-action-ddeath-devices-offline")
def test_data_from_a_device_whose_dbirth_the_host_missed_brings_a_rebirth_request_for_its_node(broker):
    """A device's data is read by the aliases of its DBIRTH: a DDATA from a device not born since its
    node's last NBIRTH (never born, or dead since) asks the node for a rebirth, which births every device
    again; a device born since its node's birth brings none."""
    commands = PahoClient(broker.port, "commands")
    commands.subscribe("spBv1.0/+/NCMD/#", 1)
    node = PahoClient(broker.port, "gw9")

    async def scenario() -> None:
        sparkplug = host(broker.port)
        await sparkplug.start()
        node.publish("spBv1.0/plant1/NBIRTH/gw9", NODE_BIRTH, 1)
        node.publish("spBv1.0/plant1/NBIRTH/gw8", NODE_BIRTH, 1)
        node.publish("spBv1.0/plant1/DBIRTH/gw9/pump1", DEVICE_BIRTH, 1)
        node.publish("spBv1.0/plant1/DDATA/gw9/pump1", DEVICE_DATA, 1)
        node.publish("spBv1.0/plant1/DBIRTH/gw8/pump1", DEVICE_BIRTH, 1)
        await asyncio.to_thread(commands.expect_none, 0.5)  # both devices born since their node's birth
        node.publish("spBv1.0/plant1/DDATA/gw9/pump2", DEVICE_DATA, 1)  # never born
        [request] = await expect(commands, 1)
        assert request.topic == "spBv1.0/plant1/NCMD/gw9"
        node.publish("spBv1.0/plant1/DDEATH/gw8/pump1", DEVICE_DEATH, 1)
        node.publish("spBv1.0/plant1/DDATA/gw8/pump1", DEVICE_DATA, 1)  # dead since its birth
        [request] = await expect(commands, 1)
        assert request.topic == "spBv1.0/plant1/NCMD/gw8"
        assert sparkplug.stats["rebirth_requests"] == 2
        await sparkplug.stop()

    asyncio.run(scenario())


def test_a_new_nbirth_ends_the_births_of_the_nodes_devices_until_they_are_born_again(broker):
    """After an NBIRTH a node births its devices again: data from a device born only before it is read by
    aliases that may have changed."""
    commands = PahoClient(broker.port, "commands")
    commands.subscribe("spBv1.0/+/NCMD/#", 1)
    node = PahoClient(broker.port, "gw7")

    async def scenario() -> None:
        sparkplug = host(broker.port)
        await sparkplug.start()
        node.publish("spBv1.0/plant1/NBIRTH/gw7", NODE_BIRTH, 1)
        node.publish("spBv1.0/plant1/DBIRTH/gw7/pump1", DEVICE_BIRTH, 1)
        node.publish("spBv1.0/plant1/NBIRTH/gw7", node_birth(5), 1)
        node.publish("spBv1.0/plant1/DDATA/gw7/pump1", DEVICE_DATA, 1)
        [request] = await expect(commands, 1)
        assert request.topic == "spBv1.0/plant1/NCMD/gw7"
        await sparkplug.stop()

    asyncio.run(scenario())


def test_a_state_nested_too_deep_for_json_is_an_offline_state_and_the_host_stays_connected(broker):
    """A STATE on the host's topic of brackets nested past Python's recursion limit raised RecursionError
    out of the host's message handler: its connection failed, and retained, the STATE did it again at
    every connection, the host never online. It is read as not saying online, without being parsed (the
    recursion's depth left finalisers run meanwhile no stack): answered with the birth."""
    watcher = PahoClient(broker.port, "watcher")
    watcher.subscribe(TOPIC, 1)
    stray = PahoClient(broker.port, "stray")

    async def scenario() -> None:
        sparkplug = host(broker.port)
        await sparkplug.start()
        await expect(watcher, 1)
        stray.publish(TOPIC, b"[" * 100_000, 1, retain=True)
        stray_state, online = await expect(watcher, 2)
        assert stray_state.payload == b"[" * 100_000
        assert json.loads(online.payload) == {"online": True, "timestamp": sparkplug.connected_ms}
        assert sparkplug.client is not None and sparkplug.client.connected
        assert sparkplug.stats["offline_states_answered"] == 1
        await sparkplug.stop()

    asyncio.run(scenario())


def test_data_after_a_birth_that_cannot_be_read_brings_a_rebirth_request(broker):
    """An NBIRTH the telemetry job quarantines (a metric's value in another field than its datatype's)
    counted as the node's birth here: its data were quarantined, as of a node with no birth in force, and
    no rebirth was asked until the node connected again. Such a birth is none: the data bring a request."""
    commands = PahoClient(broker.port, "commands")
    commands.subscribe("spBv1.0/+/NCMD/#", 1)
    node = PahoClient(broker.port, "gw9")

    async def scenario() -> None:
        sparkplug = host(broker.port)
        await sparkplug.start()
        birth: Any = payload_class()()
        birth.timestamp, birth.seq = 1, 0
        metric = birth.metrics.add()
        metric.name, metric.alias, metric.datatype, metric.double_value = "Level", 1, 9, 1.5  # a Float
        node.publish("spBv1.0/plant1/NBIRTH/gw9", birth.SerializeToString(), 0)
        data = encode([MetricOut(2.5, "Float", alias=1, with_datatype=False)], timestamp_ms=2, seq=1)
        node.publish("spBv1.0/plant1/NDATA/gw9", data, 0)
        [request] = await expect(commands, 1)
        assert request.topic == "spBv1.0/plant1/NCMD/gw9"
        await sparkplug.stop()

    asyncio.run(scenario())


def test_a_connection_the_broker_refuses_is_said_so_with_its_reason(broker, capsys):
    """A CONNECT the broker answered with a failure was said as 'cannot reach HOST:PORT: CONNECT refused
    with reason code 0x85', as if the broker were not there; it says the broker refused it, and why."""
    argv = ["sparkplug-host", "--broker", f"127.0.0.1:{broker.port}", "--host-id", "h" * 200]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"127.0.0.1:{broker.port} refused the connection: 0x85 client identifier not valid" in err
    assert "cannot reach" not in err


def test_data_naming_an_alias_its_birth_did_not_define_brings_a_rebirth_request(broker):
    """Data of a born node or device naming an alias its birth does not define (a metric added without a
    rebirth) is quarantined by the telemetry job (sparkplug_unknown_alias), and the host asked nothing:
    every message after it was quarantined until the node rebirthed for another reason."""
    commands = PahoClient(broker.port, "commands")
    commands.subscribe("spBv1.0/+/NCMD/#", 1)
    node = PahoClient(broker.port, "gw9")

    async def scenario() -> None:
        sparkplug = host(broker.port)
        await sparkplug.start()
        level = MetricOut(1.5, "Double", name="Level", alias=1)
        node.publish("spBv1.0/plant1/NBIRTH/gw9", encode([bdseq_metric(0), level], timestamp_ms=1, seq=0), 0)
        device_birth = encode([MetricOut(2.0, "Float", name="T", alias=10)], timestamp_ms=2, seq=1)
        node.publish("spBv1.0/plant1/DBIRTH/gw9/pump", device_birth, 0)
        known = encode([MetricOut(2.5, "Double", alias=1, with_datatype=False)], timestamp_ms=3, seq=2)
        node.publish("spBv1.0/plant1/NDATA/gw9", known, 0)
        by_name = encode([MetricOut(3.0, "Float", name="T", with_datatype=False)], timestamp_ms=4, seq=3)
        node.publish("spBv1.0/plant1/DDATA/gw9/pump", by_name, 0)
        await asyncio.to_thread(commands.expect_none, 0.3)  # what the births define: no request
        unknown = encode([MetricOut(3.5, "Float", alias=11, with_datatype=False)], timestamp_ms=5, seq=4)
        node.publish("spBv1.0/plant1/DDATA/gw9/pump", unknown, 0)
        [request] = await expect(commands, 1)
        assert request.topic == "spBv1.0/plant1/NCMD/gw9"
        await sparkplug.stop()

    asyncio.run(scenario())


def test_a_host_with_an_exempt_account_asks_more_nodes_for_a_rebirth_than_a_clients_topic_quota(
    start_broker, tmp_path
):
    """Each rebirth request is a topic the host's client creates (the broker logs the Sparkplug B
    namespace), and limits.max_topics_per_client (then 1000 by default) refused the NCMDs to nodes past it,
    at QoS 0 without a word; with no way to log in, the host could not be the exempt account the limit
    leaves out. ``--username`` and ``--password-file`` log it in."""
    passwords = tmp_path / "passwd"
    PasswordFile.set_password(passwords, "scada", "pw-scada", create=True)
    PasswordFile.set_password(passwords, "gateway", "pw-gateway")
    (tmp_path / "scada.password").write_text("pw-scada\n")
    broker = start_broker(
        listeners=[{"name": "tcp", "host": "127.0.0.1", "port": 0, "allow_anonymous": False}],
        auth={"password_file": str(passwords)},
        limits={"max_topics_per_client": 3, "exempt_users": ["scada"]},
    )
    commands = PahoClient(broker.port, "commands", username="gateway", password="pw-gateway")
    commands.subscribe("spBv1.0/+/NCMD/#", 0)
    nodes = [PahoClient(broker.port, f"gw{n}", username="gateway", password="pw-gateway") for n in range(5)]
    argv = ["--broker", f"127.0.0.1:{broker.port}", "--host-id", "scada", "--username", "scada"]
    args = build_parser().parse_args([*argv, "--password-file", str(tmp_path / "scada.password")])

    async def scenario() -> None:
        sparkplug = host_of(args)
        await sparkplug.start()
        data = encode([MetricOut(1.0, "Double", alias=1, with_datatype=False)], timestamp_ms=1, seq=1)
        for n, node in enumerate(nodes):
            node.publish(f"spBv1.0/plant1/NDATA/gw{n}", data, 0)
        requests = await expect(commands, 5)
        assert sorted(r.topic for r in requests) == [f"spBv1.0/plant1/NCMD/gw{n}" for n in range(5)]
        await sparkplug.stop()

    asyncio.run(scenario())


def test_the_host_reaches_a_tls_listener_with_the_ca_of_its_certificate(start_broker, tmp_path, capsys):
    """A broker whose devices' listener serves TLS only, its certificate from our own CA: ``--cafile``
    trusts that CA and the host's STATE birth is published over TLS; a CA file that does not load is a
    wrong command line (status 2) naming the option."""
    pki = LocalPki(tmp_path / "pki", name="plant-ca")
    server = pki.server("edge")
    tls = {"certfile": str(server.cert), "keyfile": str(server.key)}
    broker = start_broker(
        listeners=[
            {"name": "plain", "type": "tcp", "host": "127.0.0.1", "port": 0},
            {"name": "devices", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": tls},
        ]
    )
    watcher = PahoClient(broker.port_of("plain"), "watcher")
    watcher.subscribe("spBv1.0/STATE/scada", 1)
    address = f"127.0.0.1:{broker.port_of('devices')}"
    args = build_parser().parse_args(
        ["--broker", address, "--host-id", "scada", "--cafile", str(pki.ca.cert)]
    )

    async def scenario() -> None:
        sparkplug = host_of(args)
        await sparkplug.start()
        births = await expect(watcher, 1)
        assert json.loads(births[0].payload)["online"] is True
        await sparkplug.stop()

    asyncio.run(scenario())
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("no certificate\n")
    assert main(["sparkplug-host", "--broker", address, "--cafile", str(not_pem)]) == 2
    assert "--cafile: cannot load CA certificates from" in capsys.readouterr().err


def test_the_command_logs_a_lost_connection_and_its_return_with_time_and_level(start_broker, tmp_path):
    """``timestone sparkplug-host`` set up no log handler and logged nothing: a broker gone for minutes left
    the host offline (its will said so to every edge node) without a line on its standard error."""
    import os
    import selectors
    import signal
    import subprocess
    import sys
    import time

    first = start_broker()
    port = first.port
    command = [sys.executable, "-m", "pipelines.cli", "sparkplug-host", "--broker", f"127.0.0.1:{port}"]
    command += ["--reconnect-delay", "0.05", "--log-level", "debug"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    host = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    selector = selectors.DefaultSelector()
    assert host.stdout is not None and host.stderr is not None
    selector.register(host.stderr, selectors.EVENT_READ)

    def wait_for(text: str) -> str:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if selector.select(timeout=0.2):
                line = host.stderr.readline()
                lines.append(line)
                if text in line:
                    return line
        raise AssertionError(f"no line with {text!r} in {lines}")

    try:
        assert "online" in host.stdout.readline()
        first.stop()
        keeper = PortKeeper(port)
        lost = wait_for("connection to")
        failed = wait_for("cannot connect")
        keeper.release()
        start_broker(listeners=[{"name": "tcp", "type": "tcp", "host": "127.0.0.1", "port": port}])
        back = wait_for("connected again")
    finally:
        host.send_signal(signal.SIGTERM)
        assert host.wait(timeout=20) == 0

    assert " WARNING pipelines.sparkplug_host: " in lost and f"connection to 127.0.0.1:{port} lost" in lost
    assert " WARNING pipelines.sparkplug_host: cannot connect again to" in failed
    assert " INFO pipelines.sparkplug_host: connected again" in back and "birth" in back
    assert lost[:4].isdigit()  # the time first, as the broker's lines


def test_a_tls_listener_refusing_the_hosts_certificate_is_said_so_with_its_alert(
    start_broker, tmp_path, capsys
):
    """A listener asking for a client certificate, the host giving none: the command says the broker refused
    its certificate, with the alert, and names the options, where it said 'cannot reach HOST:PORT: not
    connected' (the alert read before CONNECT was sent) and logged a traceback of the alert never read."""
    pki = LocalPki(tmp_path / "pki", name="plant-ca")
    server = pki.server("edge")
    tls = {"certfile": str(server.cert), "keyfile": str(server.key), "cafile": str(pki.ca.cert)}
    listener = {"name": "devices", "type": "tls", "host": "127.0.0.1", "port": 0}
    broker = start_broker(listeners=[{**listener, "tls": {**tls, "require_client_cert": True}}])
    address = f"127.0.0.1:{broker.port}"

    for _ in range(20):  # the alert comes with the end of the handshake or after CONNECT: either way
        assert main(["sparkplug-host", "--broker", address, "--cafile", str(pki.ca.cert)]) == 1
        err = capsys.readouterr().err  # with the broker's log of this process
        said = [line for line in err.splitlines() if line.startswith("timestone sparkplug-host:")]
        assert said == [
            f"timestone sparkplug-host: {address}: it refused this client's certificate: [SSL: "
            "TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required (_ssl.c:2580) "
            "(see --cafile, --certfile, --keyfile)"
        ]
        assert "Traceback" not in err and "never retrieved" not in err


def test_tls_to_a_plain_listener_says_the_handshake_was_cut_and_how_to_connect_plainly(broker, capsys):
    """``--tls`` towards a plain MQTT listener: the broker closes the connection on the ClientHello, and the
    command said only 'cannot reach HOST:PORT: ' (asyncio's ConnectionResetError has no text); it says the
    connection closed in the TLS handshake and that a plain listener is reached without the TLS options."""
    address = f"127.0.0.1:{broker.port}"
    assert main(["sparkplug-host", "--broker", address, "--tls"]) == 1
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("timestone sparkplug-host:")]
    assert said == [
        f"timestone sparkplug-host: {address}: TLS failed: the connection closed during the TLS handshake "
        "(a plain MQTT listener? it is reached without --tls, --cafile, --certfile)"
    ]


def numbered(seq: int) -> bytes:
    """An NDATA of the node ``reordering`` births, by alias, with sequence number ``seq``."""
    return encode([MetricOut(float(seq), "Double", alias=1, with_datatype=False)], timestamp_ms=seq, seq=seq)


def reordering(port: int, reorder_timeout_s: float) -> SparkplugHost:
    return SparkplugHost(
        "127.0.0.1", port, "timestone", rebirth_interval_s=0, reorder_timeout_s=reorder_timeout_s
    )


@pytest.mark.sparkplug(
    "tck-id-operational-behavior-host-reordering-param",
    "tck-id-operational-behavior-host-reordering-start",
    "tck-id-operational-behavior-host-reordering-rebirth",
)
def test_a_number_missing_or_repeated_past_the_reorder_timeout_brings_a_rebirth_request(broker):
    """The host followed no sequence number: a message lost or sent twice went by without a word. A
    number that skips some, or one that came already, opens a Reorder Timeout window (``--reorder-timeout``);
    when it elapses with them still missing, or after the repeat, the node is asked for a rebirth."""
    args = build_parser().parse_args(["--reorder-timeout", "0.2"])
    assert host_of(args).reorder_timeout_s == 0.2
    commands = PahoClient(broker.port, "commands")
    commands.subscribe("spBv1.0/+/NCMD/#", 1)
    node = PahoClient(broker.port, "gw9")

    async def scenario() -> None:
        sparkplug = reordering(broker.port, 0.2)
        await sparkplug.start()
        for at_ms, sent in enumerate(([0, 1, 3], [0, 1, 1])):  # 2 missing; 1 twice
            node.publish("spBv1.0/plant1/NBIRTH/gw9", node_birth(at_ms), 0)
            for seq in sent[1:]:
                node.publish("spBv1.0/plant1/NDATA/gw9", numbered(seq), 0)
            [request] = await expect(commands, 1)
            assert request.topic == "spBv1.0/plant1/NCMD/gw9"
        node.publish("spBv1.0/plant1/NBIRTH/gw9", node_birth(2), 0)
        for seq in (1, 2):
            node.publish("spBv1.0/plant1/NDATA/gw9", numbered(seq), 0)
        await asyncio.to_thread(commands.expect_none, 0.6)  # in order: no window, no request
        assert sparkplug.stats["rebirth_requests"] == sparkplug.stats["reorder_timeouts"] == 2
        await sparkplug.stop()

    asyncio.run(scenario())


@pytest.mark.sparkplug("tck-id-operational-behavior-host-reordering-success")
def test_a_number_that_arrives_late_within_the_reorder_timeout_ends_the_window_without_a_request(broker):
    commands = PahoClient(broker.port, "commands")
    commands.subscribe("spBv1.0/+/NCMD/#", 1)
    node = PahoClient(broker.port, "gw9")

    async def scenario() -> None:
        sparkplug = reordering(broker.port, 1.0)
        await sparkplug.start()
        node.publish("spBv1.0/plant1/NBIRTH/gw9", NODE_BIRTH, 0)
        for seq in (1, 2, 4, 3, 5):  # 3 after 4, at once
            node.publish("spBv1.0/plant1/NDATA/gw9", numbered(seq), 0)
            if seq == 2:  # another host's command to a device: no number of the node's sequence
                command = encode([MetricOut(1.0, "Double", name="Setpoint")], timestamp_ms=3, seq=None)
                node.publish("spBv1.0/plant1/DCMD/gw9/pump", command, 0)
        await asyncio.to_thread(commands.expect_none, 1.5)  # past the timeout
        assert sparkplug.stats["out_of_order"] == sparkplug.stats["reordered"] == 1
        assert sparkplug.stats["reorder_timeouts"] == 0
        assert sparkplug.state.sequences[("plant1", "gw9")].timer is None
        await sparkplug.stop()

    asyncio.run(scenario())


def test_a_birth_whose_aliases_are_not_unique_brings_a_rebirth_request_at_once(broker):
    """[tck-id-payloads-alias-uniqueness] A birth giving one alias to two metrics is none (the telemetry
    job quarantines it, and the data after it): the host forgot the birth before it but asked nothing until
    the node's next data. It asks for a rebirth at once. Alias 0 is an alias like any other."""
    commands = PahoClient(broker.port, "commands")
    commands.subscribe("spBv1.0/+/NCMD/#", 1)
    node = PahoClient(broker.port, "gw9")
    level = MetricOut(1.5, "Double", name="Level", alias=0)
    flow, twice = (MetricOut(2.5, "Double", name="Flow", alias=alias) for alias in (1, 0))

    async def scenario() -> None:
        sparkplug = host(broker.port)
        await sparkplug.start()
        birth = encode([bdseq_metric(0), level, flow], timestamp_ms=1, seq=0)
        node.publish("spBv1.0/plant1/NBIRTH/gw9", birth)
        by_alias_0 = encode([MetricOut(1.0, "Double", alias=0, with_datatype=False)], timestamp_ms=2, seq=1)
        node.publish("spBv1.0/plant1/NDATA/gw9", by_alias_0)
        await asyncio.to_thread(commands.expect_none, 0.3)  # alias 0 defined: nothing to ask
        node.publish("spBv1.0/plant1/DBIRTH/gw9/pump", encode([level, twice], timestamp_ms=3, seq=2))
        [request] = await expect(commands, 1)
        assert request.topic == "spBv1.0/plant1/NCMD/gw9"
        ambiguous = encode([bdseq_metric(0), level, twice], timestamp_ms=4, seq=0)
        node.publish("spBv1.0/plant1/NBIRTH/gw8", ambiguous)
        [request] = await expect(commands, 1)
        assert request.topic == "spBv1.0/plant1/NCMD/gw8"
        assert sparkplug.stats["rebirth_requests"] == 2
        await sparkplug.stop()

    asyncio.run(scenario())


def test_a_dbirth_giving_an_alias_of_the_nbirth_or_of_another_device_brings_a_rebirth_request_at_once(broker):
    """[tck-id-payloads-alias-uniqueness] Aliases are unique across an edge node's metrics, its devices'
    included. A DBIRTH giving an alias its node's NBIRTH or another device's DBIRTH gives was taken, and
    the device's data by it read as that birth's metric whichever the node meant. The telemetry job
    quarantines such a birth; the host asks the node for a rebirth at once."""
    commands = PahoClient(broker.port, "commands")
    commands.subscribe("spBv1.0/+/NCMD/#", 1)
    node = PahoClient(broker.port, "gw9")
    level = MetricOut(1.5, "Double", name="Level", alias=1)

    def device_birth(name: str, alias: int, seq: int) -> bytes:
        return encode([MetricOut(2.5, "Float", name=name, alias=alias)], timestamp_ms=seq, seq=seq)

    async def scenario() -> None:
        sparkplug = host(broker.port)
        await sparkplug.start()
        for name in ("gw9", "gw8"):
            node.publish(
                f"spBv1.0/plant1/NBIRTH/{name}",
                encode([bdseq_metric(0), level], timestamp_ms=1, seq=0),
                0,
            )
            node.publish(f"spBv1.0/plant1/DBIRTH/{name}/pump", device_birth("T", 10, 1), 0)
        node.publish("spBv1.0/plant1/DBIRTH/gw9/pump", device_birth("T", 10, 2), 0)  # born again: its own
        await asyncio.to_thread(commands.expect_none, 0.3)  # unique aliases: nothing to ask
        node.publish("spBv1.0/plant1/DBIRTH/gw9/valve", device_birth("P", 10, 3), 0)  # pump's alias
        [request] = await expect(commands, 1)
        assert request.topic == "spBv1.0/plant1/NCMD/gw9"
        node.publish("spBv1.0/plant1/DBIRTH/gw8/valve", device_birth("P", 1, 2), 0)  # the node's alias
        [request] = await expect(commands, 1)
        assert request.topic == "spBv1.0/plant1/NCMD/gw8"
        assert sparkplug.stats["rebirth_requests"] == 2
        assert sorted(sparkplug.state.devices[("plant1", "gw9")]) == ["pump"]
        await sparkplug.stop()

    asyncio.run(scenario())


def test_a_late_copy_of_the_nbirth_in_force_ends_no_device_birth_and_brings_no_rebirth_request(broker):
    """A bridge passing an NBIRTH on twice delivered its copy after the node's DBIRTHs: the host took it for
    a new birth, forgot the devices' births and asked a rebirth at the device's next data (and its sequence
    restarted, the data's numbers out of order). The telemetry job takes such a copy for the duplicate it is
    (docs/payload-formats.md); so does the host: the same bytes as the NBIRTH in force change nothing."""
    commands = PahoClient(broker.port, "commands")
    commands.subscribe("spBv1.0/+/NCMD/#", 1)
    node = PahoClient(broker.port, "gw9")
    birth = encode([bdseq_metric(0), MetricOut(1.5, "Double", name="Level", alias=1)], timestamp_ms=1, seq=0)

    def pump_data(seq: int) -> bytes:
        return encode([MetricOut(2.5, "Float", alias=10, with_datatype=False)], timestamp_ms=seq, seq=seq)

    async def scenario() -> None:
        sparkplug = reordering(broker.port, 0.2)
        await sparkplug.start()
        node.publish("spBv1.0/plant1/NBIRTH/gw9", birth, 0)
        device_birth = encode([MetricOut(2.0, "Float", name="T", alias=10)], timestamp_ms=1, seq=1)
        node.publish("spBv1.0/plant1/DBIRTH/gw9/pump", device_birth, 0)
        node.publish("spBv1.0/plant1/DDATA/gw9/pump", pump_data(2), 0)
        node.publish("spBv1.0/plant1/NBIRTH/gw9", birth, 0)  # the copy
        node.publish("spBv1.0/plant1/DDATA/gw9/pump", pump_data(3), 0)
        await asyncio.to_thread(commands.expect_none, 0.6)  # past the reorder timeout
        assert sorted(sparkplug.state.devices[("plant1", "gw9")]) == ["pump"]
        assert sparkplug.stats["rebirth_requests"] == 0
        await sparkplug.stop()

    asyncio.run(scenario())
