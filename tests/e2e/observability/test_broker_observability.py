"""What operators see of a running broker: /metrics per listener, /health, $SYS topics, connection logs."""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker_edge.observe.logs import JsonFormatter, TextFormatter
from broker_edge.protocol.packets import PubAck, Publish
from tests.e2e.broker_clients import PahoClient, RawClient, wait_for
from tests.harness.log_records import KeptRecords

TWO_LISTENERS = [
    {"name": "north", "type": "tcp", "host": "127.0.0.1", "port": 0},
    {"name": "south", "type": "tcp", "host": "127.0.0.1", "port": 0},
]


def scrape(broker) -> dict[tuple[str, frozenset], float]:
    """Every sample of GET /metrics, by (sample name, labels)."""
    url = f"http://127.0.0.1:{broker.broker.admin_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_metrics_endpoint_per_listener(start_broker):
    broker = start_broker(listeners=TWO_LISTENERS)
    north, south = broker.port_of("north"), broker.port_of("south")
    sub = RawClient(south, 5)
    sub.connect("sub")
    sub.subscribe("m/#", 1)
    pub = RawClient(north, 5)
    pub.connect("pub")
    pub.send_packet(Publish("m/a", b"q1", 1, packet_id=1))
    assert isinstance(pub.recv(), PubAck)
    pub.send_packet(Publish("m/b", b"q0"))
    pub.send_packet(Publish("nobody/listens", b"lost", 1, packet_id=2))
    assert pub.recv().reason_code == 0x10
    delivered = [sub.recv(), sub.recv()]  # the QoS 1 one stays unacknowledged: one message in flight
    assert [(p.payload, p.qos) for p in delivered] == [(b"q1", 1), (b"q0", 0)]
    RawClient(north, 5).send(b"\x00\x00")  # refused: a protocol error before CONNECT
    assert wait_for(lambda: broker.refused("protocol_error") == 1)

    samples = scrape(broker)
    prefix = "timestone_broker_"
    assert sample(samples, prefix + "connections", listener="north") == 1
    assert sample(samples, prefix + "connections", listener="south") == 1
    assert sample(samples, prefix + "connections_accepted_total", listener="north") == 1
    assert sample(samples, prefix + "messages_received_total", listener="north", qos="1") == 2
    assert sample(samples, prefix + "messages_received_total", listener="north", qos="0") == 1
    assert sample(samples, prefix + "messages_received_total", listener="south", qos="1") == 0
    assert sample(samples, prefix + "messages_sent_total", listener="south", qos="1") == 1
    assert sample(samples, prefix + "messages_sent_total", listener="south", qos="0") == 1
    assert sample(samples, prefix + "messages_sent_total", listener="north", qos="1") == 0
    assert sample(samples, prefix + "bytes_received_total", listener="north") >= 3 * 8
    assert sample(samples, prefix + "bytes_sent_total", listener="south") >= len(b"q1q0") + 2 * 8
    assert sample(samples, prefix + "messages_dropped_total", reason="no_subscribers") == 1
    assert sample(samples, prefix + "messages_dropped_total", reason="slow_subscriber") == 0
    assert sample(samples, prefix + "connections_refused_total", reason="protocol_error") == 1
    assert sample(samples, prefix + "inflight_messages") == 1
    assert sample(samples, prefix + "subscriptions") == 1
    assert sample(samples, prefix + "sessions", state="online") == 2
    assert sample(samples, prefix + "disconnects_total", reason="slow_subscriber") == 0

    sub.send_packet(PubAck(delivered[0].packet_id))
    pub.close()
    assert wait_for(lambda: broker.metric(prefix + "inflight_messages") == 0)
    assert wait_for(lambda: broker.metric(prefix + "connections", listener="north") == 0)


def test_every_log_commit_is_in_the_commit_seconds_histogram_and_nothing_else_is(start_broker):
    broker = start_broker(storage={})
    pub = RawClient(broker.port, 5)
    pub.connect("pub")
    name = "timestone_broker_log_commit_seconds"
    before = scrape(broker)
    started = time.monotonic()
    for packet_id in range(1, 6):  # one at a time: each PUBACK waits for its own commit
        pub.send_packet(Publish(f"plant/{packet_id}", b"logged", 1, packet_id=packet_id))
        assert isinstance(pub.recv(), PubAck)
    elapsed = time.monotonic() - started
    after = scrape(broker)
    commits = sample(after, name + "_count") - sample(before, name + "_count")
    assert commits >= 5
    assert 0 < sample(after, name + "_sum") - sample(before, name + "_sum") < elapsed
    buckets = sorted(
        (float(dict(labels)["le"]), value)
        for (sample_name, labels), value in after.items()
        if sample_name == name + "_bucket"
    )
    assert [value for _, value in buckets] == sorted(value for _, value in buckets)
    assert buckets[-1] == (float("inf"), sample(after, name + "_count"))

    for _ in range(3):  # QoS 0: nothing appended, nothing committed
        pub.send_packet(Publish("plant/1", b"not logged"))
    pub.send_packet(Publish("plant/1", b"logged", 1, packet_id=9))
    assert isinstance(pub.recv(), PubAck)
    assert sample(scrape(broker), name + "_count") - sample(after, name + "_count") == 1


def test_health_endpoint(start_broker):
    broker = start_broker(listeners=TWO_LISTENERS)
    PahoClient(broker.port_of("north"), "h1")
    url = f"http://127.0.0.1:{broker.broker.admin_port}/health"
    response = urllib.request.urlopen(url, timeout=5)
    report = json.loads(response.read())
    assert response.status == 200
    assert report["status"] == "ok"
    assert report["listeners"] == {"north": broker.port_of("north"), "south": broker.port_of("south")}
    assert (report["connections"], report["sessions"]) == (1, 1)
    broker.call(lambda: setattr(broker.broker, "_stopping", True))  # what a stopping broker reports
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(url, timeout=5)
    assert error.value.code == 503
    broker.call(lambda: setattr(broker.broker, "_stopping", False))


def test_health_counts_connections_before_and_after_connect(start_broker):
    broker = start_broker()
    PahoClient(broker.port, "c1")
    PahoClient(broker.port, "c2")
    waiting = socket.create_connection(("127.0.0.1", broker.port), timeout=5)  # no CONNECT yet
    try:
        assert wait_for(lambda: broker.call(lambda: len(broker.broker.connections)) == 3)
        assert broker.call(broker.broker.connection_count) == 3
        url = f"http://127.0.0.1:{broker.broker.admin_port}/health"
        assert json.loads(urllib.request.urlopen(url, timeout=5).read())["connections"] == 3
    finally:
        waiting.close()
    assert wait_for(lambda: broker.call(broker.broker.connection_count) == 2)


def test_sys_topics(start_broker):
    broker = start_broker(sys_topics={"enabled": True, "interval_s": 60})
    pub = PahoClient(broker.port, "pub")
    pub.subscribe("x", 1)
    for _ in range(3):
        pub.publish("x", b"1", 1)
    assert len(pub.expect(3)) == 3
    watcher = PahoClient(broker.port, "watcher")
    broker.call(broker.broker.publish_sys_topics)
    watcher.subscribe("$SYS/broker/#", 0)  # retained: the figures come on SUBSCRIBE
    watcher.subscribe("#", 0)  # and a root wildcard does not see them
    figures: dict[str, str] = {}
    while len(figures) < 17:
        message = watcher.expect(1)[0]
        assert message.topic.startswith("$SYS/broker/") and message.retain
        figures[message.topic.removeprefix("$SYS/broker/")] = message.payload.decode()
    assert figures["messages/received"] == figures["messages/sent"] == "3"
    assert figures["clients/connected"] == "2"
    assert figures["subscriptions/count"] == "1"
    assert figures["version"].startswith("timestone ")
    assert figures["uptime"].endswith(" seconds")
    watcher.expect_none(0.2)


@pytest.fixture
def broker_records():
    """Every record the broker's loggers write during the test (INFO and above)."""
    handler = KeptRecords(logging.INFO)
    records = handler.records
    logger = logging.getLogger("broker_edge")
    previous = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(previous)


def test_every_connection_log_line_names_its_client(start_broker, broker_records):
    broker = start_broker(limits={"max_client_id_length": 30})
    PahoClient(broker.port, "polite").disconnect()
    bad = RawClient(broker.port, 5)
    bad.connect("malformed")
    bad.send(b"\x30\x05\x00\x02\xc3\x28\x00")
    assert bad.closed()
    RawClient(broker.port, 5).connect("too-long-" * 5)
    RawClient(broker.port, 5).connect("twin")
    RawClient(broker.port, 5).connect("twin")
    sleepy = RawClient(broker.port, 5)
    sleepy.connect("sleepy", keep_alive=10)
    connection = broker.connection("sleepy")
    broker.call(lambda: connection.check_timers(broker.broker.loop.time() + 100))
    assert sleepy.closed()
    assert wait_for(lambda: not broker.connected("polite") and not broker.connected("malformed"))

    lines = [r for r in broker_records if r.name == "broker_edge.connection"]
    messages = {(r.client_id, r.getMessage().split(":")[0].split(" (")[0]) for r in lines}
    assert {
        ("polite", "connected"),
        ("polite", "disconnected"),
        ("malformed", "protocol error, closing"),
        ("too-long-too-long-too-long-too", "connection refused"),
        ("twin", "session taken over by a new connection"),
        ("sleepy", "keep alive timeout"),
    } <= messages
    for record in lines:
        assert record.client_id and record.listener == "tcp" and record.peer.startswith("127.0.0.1:")
        document = json.loads(JsonFormatter().format(record))
        assert document["client_id"] == record.client_id


HOSTILE = "d\x1b[2J\x1b[31mred\x9b1m\u2028FORGED\u202eevil\x07\x7f"


def test_a_client_id_with_control_characters_cannot_forge_or_colour_log_lines(start_broker, broker_records):
    """A client id or user name holding ANSI escapes, C1 controls, a line or paragraph separator or a bidi
    override is written escaped, in text as in JSON: one line per record, nothing a terminal acts on."""
    broker = start_broker()
    RawClient(broker.port, 5).connect(HOSTILE, username="u\x1b]0;title\x07\u2029x")
    assert wait_for(lambda: any(r.getMessage() == "connected" for r in broker_records))
    record = next(r for r in broker_records if r.getMessage() == "connected")
    record.msg = "connected " + HOSTILE  # a message carrying client text is escaped the same way
    text = TextFormatter().format(record)
    json_line = JsonFormatter().format(record)
    for line in (text, json_line):
        assert len(line.splitlines()) == 1, line
        assert all(c.isprintable() for c in line), repr(line)
    assert "client_id=" + json.dumps(HOSTILE) in text
    assert "connected " + json.dumps(HOSTILE)[1:-1] in text
    document = json.loads(json_line)
    assert document["client_id"] == HOSTILE and document["username"] == "u\x1b]0;title\x07\u2029x"


def test_connections_refused_before_connect_write_rate_limited_refusal_lines(start_broker, broker_records):
    """A stranger opening connections that send garbage, or nothing, before CONNECT is refused as
    `protocol_error` or `connect_timeout`: each counted, and said in WARNING refusal lines limited to 20 per
    reason per 10 s, as every refusal is, where each wrote an INFO line of its own without bound."""
    broker = start_broker(limits={"connect_timeout_s": 0.2})
    for _ in range(60):
        with socket.create_connection(("127.0.0.1", broker.port)) as garbage:
            garbage.sendall(b"\xff\xff\xff\xff\xff")
            garbage.recv(16)
    idle = [socket.create_connection(("127.0.0.1", broker.port)) for _ in range(30)]
    assert wait_for(lambda: broker.refused("protocol_error") == 60)
    assert wait_for(lambda: broker.refused("connect_timeout") == 30)
    for sock in idle:
        sock.close()
    lines = [r for r in broker_records if r.name == "broker_edge.connection"]
    for reason in ("protocol_error", "connect_timeout"):
        said = [r for r in lines if getattr(r, "reason", None) == reason]
        assert len(said) == 20, [r.getMessage() for r in said]
        assert all(r.levelname == "WARNING" and r.action == "connect" for r in said)
        assert said[0].getMessage().startswith(f"connection refused: {reason} (")
    assert not [r for r in lines if r.levelno < logging.WARNING and r.client_id == "-"]


def test_connections_holding_an_unfinished_first_packet_write_rate_limited_refusal_lines(
    start_broker, broker_records
):
    """Sockets that start a first packet and never finish it are refused as `partial_timeout`: counted, and
    said in WARNING refusal lines limited to 20 per 10 s, where each wrote an INFO line without bound."""
    broker = start_broker(limits={"partial_packet_timeout_s": 0.2})
    slow = [socket.create_connection(("127.0.0.1", broker.port)) for _ in range(30)]
    for sock in slow:
        sock.sendall(b"\x10\x20\x00")
    assert wait_for(lambda: broker.refused("partial_timeout") == 30)
    for sock in slow:
        sock.close()
    lines = [r for r in broker_records if r.name == "broker_edge.connection"]
    said = [r for r in lines if getattr(r, "reason", None) == "partial_timeout"]
    assert len(said) == 20 and all(r.levelname == "WARNING" and r.action == "connect" for r in said)
    assert said[0].getMessage().startswith("connection refused: partial_timeout (")
    assert not [r for r in lines if r.levelno < logging.WARNING and r.client_id == "-"]
