"""Runs of plain PUBLISHes read together (``engine.publish_run``): at QoS 0 every subscriber gets the same
bytes, and the broker counts, refuses, limits and drops the same, as when each PUBLISH came in a read of its
own; at QoS 1 the log, the deliveries and the publisher's PUBACKs are the same too."""

from collections.abc import Callable
from typing import Any

import pytest

from broker_edge.engine.message import OFFSETS_OPT_IN
from broker_edge.engine.publish_run import LoggedRun, PublishRun
from broker_edge.protocol.codec import PacketDecoder, encode
from broker_edge.protocol.decoder import MAX_PACKET_SIZE, shared_decoder
from broker_edge.protocol.encoder import around_packet_id
from broker_edge.protocol.packets import (
    MQTT_3_1_1,
    MQTT_5,
    Disconnect,
    PubAck,
    Publish,
    PublishesAlike,
    Subscribe,
    Subscription,
)
from broker_edge.protocol.properties import Properties
from broker_edge.protocol.reason_codes import ReasonCode
from tests.unit.broker_edge.engine.handlers.wire import HandDrivenCore, WireClient, make_core
from tests.unit.broker_edge.engine.stand_ins import MemoryLog

Subscribers = dict[str, WireClient]


def _connected(
    core: HandDrivenCore,
    name: str,
    version: int,
    subscription: Subscription | None = None,
    sub_id: int | None = None,
    **connect: Any,
) -> WireClient:
    """A client connected as ``name``, subscribed to ``subscription`` (with subscription identifier
    ``sub_id``) when given."""
    client = core.client(version)
    client.connect(name, **connect)
    if subscription is not None:
        properties = Properties(subscription_identifiers=[sub_id]) if sub_id else None
        client.send(Subscribe(1, [subscription], properties))
    return client


def _subscribers(core: HandDrivenCore) -> Subscribers:
    """Subscribers of every kind a run's delivery tells apart."""
    found: Subscribers = {}

    def add(
        name: str, version: int, subscription: Subscription, sub_id: int | None = None, **connect
    ) -> None:
        client = core.client(version)
        client.connect(name, **connect)
        properties = Properties(subscription_identifiers=[sub_id]) if sub_id else None
        client.send(Subscribe(1, [subscription], properties))
        found[name] = client

    add("v3-qos0", MQTT_3_1_1, Subscription("t/#", 0))
    add("v3-qos1", MQTT_3_1_1, Subscription("t/#", 1))
    add("v5-qos0", MQTT_5, Subscription("t/#", 0))
    add("v5-qos2", MQTT_5, Subscription("t/+", 2))
    add("v5-sub-id", MQTT_5, Subscription("t/a", 0), sub_id=7)
    add("v5-aliases", MQTT_5, Subscription("t/#", 0), properties=Properties(topic_alias_maximum=2))
    add("v5-small", MQTT_5, Subscription("t/#", 0), properties=Properties(maximum_packet_size=40))
    add("v5-no-local", MQTT_5, Subscription("t/#", 0, no_local=True))
    add("shared-1", MQTT_5, Subscription("$share/g/t/b", 0))
    add("shared-2", MQTT_3_1_1, Subscription("$share/g/t/b", 0))
    offsets = Properties(user_properties=[OFFSETS_OPT_IN])
    add("v5-offsets", MQTT_5, Subscription("t/#", 0), properties=offsets)
    return found


def _deliveries(
    version: int,
    packets: list[Publish],
    together: bool,
    before: Callable[[HandDrivenCore, Subscribers], None] = lambda core, subscribers: None,
    turn_each: bool = False,
    **sections: Any,
) -> tuple[dict[str, bytes], HandDrivenCore]:
    """What each subscriber was sent when ``packets`` came in one read (``together``) or one per read (each
    read in a loop turn of its own when ``turn_each``: each logged publish persisted and routed alone); an
    MQTT 5 publisher is the No Local subscriber."""
    core = make_core(**sections)
    subscribers = _subscribers(core)
    publisher = subscribers["v5-no-local"] if version == MQTT_5 else _connected(core, "publisher", version)
    before(core, subscribers)
    frames = [encode(packet, version) for packet in packets]
    for data in [b"".join(frames)] if together else frames:
        publisher.conn.receive(data)
        if turn_each:
            core.run_soon()
    core.run_soon()
    sent = {name: b"".join(client.conn.take_output() or ()) for name, client in subscribers.items()}
    if version != MQTT_5:
        sent["publisher"] = b"".join(publisher.conn.take_output() or ())
    return sent, core


def _runs(payload_sizes: tuple[int, ...] = (3,)) -> list[Publish]:
    """Runs on two topics, broken by a QoS 1 publish, a retained one and one with properties."""
    sizes = iter(payload_sizes * 20)
    plain = [Publish("t/a", b"a%d" % n + b"x" * next(sizes)) for n in range(5)]
    plain += [Publish("t/a", b"q1", 1, packet_id=3)]
    plain += [Publish("t/b", b"b%d" % n + b"y" * next(sizes)) for n in range(4)]
    plain += [Publish("t/b", b"kept", retain=True), Publish("t/b", b"b-last")]
    plain += [Publish("t/a", b"typed", properties=Properties(content_type="text/plain"))]
    plain += [Publish("t/a", b"a%d" % n) for n in range(5, 8)]
    return plain


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_every_subscriber_gets_a_read_of_runs_as_the_publishes_one_by_one(version):
    """Subscribers of the publisher's family get the frames as received; other families, subscription
    identifiers, topic aliases, a small Maximum Packet Size, No Local and a shared group are each served as
    a lone PUBLISH would be; the counters agree."""
    packets = _runs(payload_sizes=(3, 40, 3))
    together, core = _deliveries(version, packets, together=True)
    alone, reference = _deliveries(version, packets, together=False)
    assert together == alone
    assert all(together[name] for name in together if name != "v5-no-local" or version != MQTT_5)
    assert core.listener.stats.received == reference.listener.stats.received
    assert core.listener.stats.sent == reference.listener.stats.sent
    assert core.counters.drops("too_large") == reference.counters.drops("too_large") > 0


def test_a_run_nobody_subscribed_to_counts_each_message_dropped():
    packets = [Publish("nobody/here", b"%d" % n) for n in range(6)]
    _, core = _deliveries(MQTT_3_1_1, packets, together=True)
    assert core.counters.drops("no_subscribers") == 6


@pytest.mark.parametrize("topic", ["$SYS/forged", "t/denied"])
def test_a_refused_run_is_refused_one_publish_at_a_time(topic):
    """A topic the client may not publish to: each PUBLISH of the run is refused and counted as alone."""
    sections: dict[str, Any] = {
        "acl": {"rules": [{"permission": "deny", "action": "publish", "topic": topic}]}
    }
    packets = [Publish(topic, b"%d" % n) for n in range(4)]
    together, core = _deliveries(MQTT_3_1_1, packets, together=True, **(sections if topic[0] != "$" else {}))
    assert not any(together.values())
    assert core.counters.drops("acl_denied") == 4


def test_a_run_past_the_clients_message_rate_is_held_where_the_rate_runs_out():
    """The bucket takes a whole run only when it has a token for each; else the PUBLISHes go one by one and
    the rest of the read waits, as it always has."""
    limits = {"messages_per_second_per_client": 1, "messages_burst_per_client": 3}
    packets = [Publish("t/a", b"%d" % n) for n in range(5)]
    together, core = _deliveries(MQTT_3_1_1, packets, together=True, limits=limits)
    alone, _ = _deliveries(MQTT_3_1_1, packets, together=False, limits=limits)
    assert together["v3-qos0"] == alone["v3-qos0"] == b"".join(encode(p, MQTT_3_1_1) for p in packets[:3])
    assert core.counters.throttled == 1
    short = [Publish("t/a", b"%d" % n) for n in range(3)]
    together, _ = _deliveries(MQTT_3_1_1, short, together=True, limits=limits)
    assert together["v3-qos0"] == b"".join(encode(p, MQTT_3_1_1) for p in short)


def test_a_paused_subscriber_gets_a_run_as_its_slow_subscriber_policy_says():
    """A subscriber whose write buffer is full: each message of the run goes through the policy (here
    ``drop_qos0``: every one dropped and counted), the others get theirs."""

    def pause(core: HandDrivenCore, subscribers: Subscribers) -> None:
        subscribers["v3-qos0"].conn.writing_paused()

    packets = [Publish("t/a", b"%d" % n) for n in range(4)]
    limits = {"slow_subscriber_policy": "drop_qos0"}
    together, core = _deliveries(MQTT_3_1_1, packets, together=True, before=pause, limits=limits)
    alone, reference = _deliveries(MQTT_3_1_1, packets, together=False, before=pause, limits=limits)
    assert together == alone
    assert together["v3-qos0"] == b"" and together["v5-qos0"]
    assert core.counters.drops("slow_subscriber") == reference.counters.drops("slow_subscriber") == 4


def test_a_run_reaches_a_subscriber_of_the_publishers_family_in_one_piece():
    """The frames as received, one write for the whole run (nothing encoded or copied per message)."""
    core = make_core()
    subscriber = _connected(core, "sub", MQTT_3_1_1, Subscription("t/#", 0))
    publisher = _connected(core, "pub", MQTT_3_1_1)
    read = b"".join(encode(Publish("t/a", b"%d" % n), MQTT_3_1_1) for n in range(50))
    publisher.conn.receive(read)
    core.run_soon()
    assert subscriber.conn.take_output() == [read]
    assert core.listener.stats.sent[0] == 50


def _durable_soon(core: HandDrivenCore) -> Callable[[Callable[[], object]], None]:
    """A ``MemoryLog``'s ``durable_soon``: durable at the end of the loop turn it is asked in."""

    def durable_soon(callback: Callable[[], object]) -> None:
        def durable() -> None:
            callback()

        core.call_soon(durable)

    return durable_soon


class LogsQos0(MemoryLog):
    def should_persist(self, topic: str, qos: int) -> bool:
        return True


def test_a_run_of_a_logged_topic_goes_one_publish_at_a_time():
    """Each message of a logged topic gets its own offset: routed once durable, one by one."""

    def logged(core: HandDrivenCore, subscribers: Subscribers) -> None:
        core.publish_path.attach_store(LogsQos0(durable_soon=_durable_soon(core)), None)

    packets = [Publish("t/a", b"%d" % n) for n in range(4)]
    together, core = _deliveries(MQTT_5, packets, together=True, before=logged)
    alone, _ = _deliveries(MQTT_5, packets, together=False, before=logged)
    assert together == alone
    assert together["v5-qos0"]
    store = core.publish_path.store
    assert isinstance(store, LogsQos0)
    assert [fields[0] for fields in store.logs["t/a"]] == [p.payload for p in packets]


def _logging(created: tuple[str, ...] = ()) -> Callable[[HandDrivenCore, Subscribers], None]:
    """A ``before`` hook: the broker logs QoS 1/2 in a ``MemoryLog`` durable at the end of each loop turn,
    the logs of ``created`` already made."""

    def attach(core: HandDrivenCore, subscribers: Subscribers) -> None:
        store = MemoryLog(durable_soon=_durable_soon(core))
        store.logs.update({topic: [] for topic in created})
        core.publish_path.attach_store(store, None)

    return attach


def _qos1_runs() -> list[Publish]:
    """QoS 1 runs on two topics, broken by a QoS 2 publish, a retained one and one with properties (a QoS 0
    one, routed before the logged ones are durable, would come earlier in one read than in a turn of its own).
    """
    ids = iter(range(1, 100))
    packets = [Publish("t/a", b"a%d" % n, 1, packet_id=next(ids)) for n in range(6)]
    packets += [Publish("t/a", b"two", 2, packet_id=next(ids))]
    packets += [Publish("t/b", b"b%d" % n + b"y" * 40, 1, packet_id=next(ids)) for n in range(4)]
    packets += [Publish("t/b", b"kept", 1, retain=True, packet_id=next(ids))]
    packets += [Publish("t/b", b"typed", 1, packet_id=next(ids), properties=Properties(content_type="a/b"))]
    packets += [Publish("t/a", b"a%d" % n, 1, packet_id=next(ids)) for n in range(6, 9)]
    return packets


def _logged(core: HandDrivenCore) -> dict[str, list[bytes]]:
    store = core.publish_path.store
    assert isinstance(store, MemoryLog)
    return {topic: [fields[0] for fields in records] for topic, records in store.logs.items()}


@pytest.mark.parametrize("created", [True, False], ids=["logs-made", "new-topics"])
@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_a_qos1_run_is_logged_delivered_and_acknowledged_as_its_publishes_one_by_one(version, created):
    """Each message of a run keeps its offset, its deliveries to every kind of subscriber (QoS 0 ones of the
    publisher's family get the frame less its packet id, in one write; the rest each message as alone) and
    its PUBACK, in order [MQTT-4.6.0-2] [MQTT-4.6.0-6], the same bytes as when each publish is persisted and
    routed in a loop turn of its own; a topic whose log the run would create goes one PUBLISH at a time (its
    quota)."""
    packets = _qos1_runs()
    hook = _logging(("t/a", "t/b") if created else ())
    runs: list[int] = []  # the runs taken together when read
    routed: list[int] = []  # and when routed

    def counting(core: HandDrivenCore, subscribers: Subscribers) -> None:
        hook(core, subscribers)
        path = core.publish_path
        take = path.accept_logged_run

        def accept_logged_run(publisher: Any, run: Any) -> None:
            runs.append(len(run))
            take(publisher, run)

        setattr(path, "accept_logged_run", accept_logged_run)  # noqa: B010 (a method replaced on one object)
        route = core.router.publish_run

        def publish_run(run: Any) -> int | None:
            if isinstance(run, LoggedRun):
                routed.append(len(run))
            return route(run)

        setattr(core.router, "publish_run", publish_run)  # noqa: B010 (a method replaced on one object)

    together, core = _deliveries(version, packets, together=True, before=counting)
    alone, reference = _deliveries(version, packets, together=False, before=hook, turn_each=True)
    assert together == alone
    assert (
        _logged(core)
        == _logged(reference)
        == {
            "t/a": [p.payload for p in packets if p.topic == "t/a" and p.qos],
            "t/b": [p.payload for p in packets if p.topic == "t/b" and p.qos],
        }
    )
    assert core.listener.stats.received == reference.listener.stats.received
    assert core.listener.stats.sent == reference.listener.stats.sent
    assert runs == ([6, 4, 3] if created else [])
    assert routed == [6, 4, 3]  # t/b's has a shared group: tried once, then one message at a time
    acks = [encode(PubAck(p.packet_id or 0), version) for p in packets if p.qos == 1]
    publisher_output = together["publisher" if version == MQTT_3_1_1 else "v5-no-local"]
    assert all(ack in publisher_output for ack in acks)


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_publishes_alike_and_others_of_one_topic_read_together_are_one_run(version):
    """Payloads of two sizes on one topic: the PUBLISHes of one size back to back come out of the broker's
    decoder as one ``PublishesAlike``, the others one by one; read together they are still one run, logged,
    delivered and acknowledged as the publishes one by one [MQTT-4.6.0-2] [MQTT-4.6.0-6]."""
    sizes = [3, 3, 3, 40, 3, 40, 40, 3, 3, 3]
    packets = [Publish("t/a", b"%d" % n + b"x" * size, 1, packet_id=n + 1) for n, size in enumerate(sizes)]
    stream = b"".join(encode(packet, version) for packet in packets)
    kinds = [type(packet).__name__ for packet in shared_decoder(MAX_PACKET_SIZE, version).feed(stream)]
    assert kinds == ["PublishesAlike", "Publish", "Publish", "PublishesAlike", "PublishesAlike"]
    runs: list[int] = []

    def counting(core: HandDrivenCore, subscribers: Subscribers) -> None:
        _logging(("t/a",))(core, subscribers)
        take = core.publish_path.accept_logged_run

        def accept_logged_run(publisher: Any, run: Any) -> None:
            runs.append(len(run))
            take(publisher, run)

        setattr(core.publish_path, "accept_logged_run", accept_logged_run)  # noqa: B010 (on one object)

    together, core = _deliveries(version, packets, together=True, before=counting)
    alone, reference = _deliveries(
        version, packets, together=False, before=_logging(("t/a",)), turn_each=True
    )
    assert runs == [len(packets)]
    assert together == alone
    assert _logged(core) == _logged(reference) == {"t/a": [p.payload for p in packets]}
    assert core.listener.stats.received == reference.listener.stats.received
    publisher_output = together["publisher" if version == MQTT_3_1_1 else "v5-no-local"]
    acks = b"".join(encode(PubAck(p.packet_id or 0), version) for p in packets)
    assert acks in publisher_output


@pytest.mark.parametrize(("version", "qos"), [(MQTT_3_1_1, 1), (MQTT_3_1_1, 0), (MQTT_5, 1)])
def test_the_messages_of_publishes_alike_share_the_frame_head_each_delivery_would_cut(version, qos):
    """An MQTT 3.1.1 QoS 1 run read as one ``PublishesAlike``: each message holds, already, the part of its
    frame before the packet id that a delivery of its family would cut (``around_packet_id``), one object
    for them all; QoS 0 and MQTT 5 messages hold none (their deliveries are made otherwise)."""
    packets = [Publish("t/a", b"%02d" % n, qos, packet_id=n + 1 if qos else None) for n in range(5)]
    (alike,) = shared_decoder(MAX_PACKET_SIZE, version).feed(b"".join(encode(p, version) for p in packets))
    assert isinstance(alike, PublishesAlike)
    messages = PublishRun([alike], "publisher", version == MQTT_5).messages()
    heads = [message.frame_head for message in messages]
    if qos and version == MQTT_3_1_1:
        cut = [around_packet_id(encode(p, version), p.payload, False)[0] for p in packets]
        assert heads == cut and len({id(head) for head in heads}) == 1
    else:
        assert heads == [None] * len(packets)


QOS1_SUBSCRIBERS = {"v3-qos1": MQTT_3_1_1, "v5-qos2": MQTT_5}
"""The subscribers of ``_subscribers`` that get QoS 1 messages at QoS 1, and their protocol versions."""


def _acknowledging(version: int, packets: list[Publish], together: bool, **sections: Any) -> dict[str, bytes]:
    """``_deliveries`` of ``packets`` to a logged topic, with what each QoS 1 subscriber is sent next as it
    PUBACKs each delivery, a read of PUBACKs at a time, until the broker has nothing more for it; under
    ``"queue_full"``, how many messages were dropped for a full queue."""
    subscribers: Subscribers = {}

    def keep(core: HandDrivenCore, found: Subscribers) -> None:
        _logging(("t/a",))(core, found)
        subscribers.update(found)

    sent, core = _deliveries(version, packets, together, before=keep, turn_each=not together, **sections)
    for name in QOS1_SUBSCRIBERS:
        client = subscribers[name]
        delivered = PacketDecoder(role="client", protocol_version=client.version).feed(sent[name])
        while delivered:
            ids = [p.packet_id for p in delivered if isinstance(p, Publish) and p.packet_id is not None]
            delivered = client.send(*(PubAck(packet_id) for packet_id in ids)) if ids else []
            sent[name] += client.received
    sent["queue_full"] = b"%d" % core.counters.drops("queue_full")
    return sent


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_a_qos1_run_past_a_subscribers_window_and_queue_goes_as_its_publishes_one_by_one(version):
    """A QoS 1 subscriber whose in-flight window a run fills (2) and whose queue it overflows (3 messages):
    the same deliveries with the same packet ids, the same ones held and sent as its PUBACKs come
    [MQTT-4.6.0-6], the same ones dropped (``queue_full``), as when each publish is routed alone."""
    packets = [Publish("t/a", b"a%d" % n, 1, packet_id=n + 1) for n in range(8)]
    limits = {"max_inflight_out": 2, "max_offline_messages": 3}
    together = _acknowledging(version, packets, together=True, limits=limits)
    assert together == _acknowledging(version, packets, together=False, limits=limits)
    assert together["queue_full"] == b"6"  # each QoS 1 subscriber: 2 in flight, 3 held, 3 dropped
    for name, subscriber_version in QOS1_SUBSCRIBERS.items():
        delivered = PacketDecoder(role="client", protocol_version=subscriber_version).feed(together[name])
        assert [p.payload for p in delivered] == [b"a0", b"a1", b"a2", b"a3", b"a4"], name


def test_a_v3_qos1_run_stops_where_the_clients_unanswered_publishes_reach_receive_maximum():
    """An MQTT 3.1.1 client's reading is held once ``limits.receive_maximum`` of its publishes wait for the
    log: a run is cut there, the rest is read once they are answered, nothing is lost."""
    core = make_core(limits={"receive_maximum": 4})
    store = MemoryLog()  # durable only when told
    store.logs["t/a"] = []
    core.publish_path.attach_store(store, None)
    publisher = _connected(core, "pub", MQTT_3_1_1)
    packets = [Publish("t/a", b"%d" % n, 1, packet_id=n + 1) for n in range(10)]
    publisher.conn.receive(b"".join(encode(p, MQTT_3_1_1) for p in packets))
    core.run_soon()
    assert len(store.logs["t/a"]) == 4
    assert publisher.reading_paused
    while store.waiting:
        store.make_durable()
        core.run_soon()
    assert [fields[0] for fields in store.logs["t/a"]] == [p.payload for p in packets]
    assert b"".join(publisher.conn.take_output() or ()) == b"".join(
        encode(PubAck(p.packet_id or 0), MQTT_3_1_1) for p in packets
    )


def test_a_v5_qos1_run_past_receive_maximum_closes_the_connection_where_the_publish_passes_it():
    """[MQTT-3.3.4-9] With ``receive_maximum_exceeded: disconnect``, an MQTT 5 client sending more QoS 1
    publishes than Receive Maximum before they are answered is disconnected with 0x93 at the first one too
    many, as when each came in a read of its own."""
    outcomes = []
    for together in (True, False):
        core = make_core(limits={"receive_maximum": 4, "receive_maximum_exceeded": "disconnect"})
        store = MemoryLog()
        store.logs["t/a"] = []
        core.publish_path.attach_store(store, None)
        publisher = _connected(core, "pub", MQTT_5)
        publisher.conn.take_output()
        frames = [encode(Publish("t/a", b"%d" % n, 1, packet_id=n + 1), MQTT_5) for n in range(6)]
        for data in [b"".join(frames)] if together else frames:
            publisher.conn.receive(data)
        core.run_soon()
        outcomes.append((store.logs["t/a"], b"".join(publisher.conn.take_output() or ()), publisher.closed))
    assert outcomes[0] == outcomes[1]
    logged, output, closed = outcomes[0]
    assert len(logged) == 4 and closed
    [disconnect] = PacketDecoder(role="client", protocol_version=MQTT_5).feed(output)
    assert isinstance(disconnect, Disconnect)
    assert disconnect.reason_code == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED
