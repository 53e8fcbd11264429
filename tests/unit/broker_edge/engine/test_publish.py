"""The PUBLISH path of a cluster member: forwarded and local parts, acknowledged in arrival order.

Fed through real ``Connection``s of a hand-driven core (``handlers/wire.py``). The log is a ``PublishStore``
kept in memory that makes batches durable when the test says so, and the cluster is a ``forwarding`` port
(``broker_edge.engine.ports``) that places topics as the test decides and holds forwarded publishes until the
test answers them: so the test chooses which part of which batch finishes first, and checks what the
publishers receive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from broker_edge.engine.answers import ForwardedBatch
from broker_edge.engine.message import Message
from broker_edge.engine.ports import (
    LOCAL_ONLY,
    AppendedRun,
    ClusterPorts,
    ForwardAck,
    PublishRefused,
    Replication,
)
from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import (
    MQTT_3_1_1,
    MQTT_5,
    PubAck,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Subscription,
)
from broker_edge.storage.errors import StorageFailed
from tests.unit.broker_edge.engine.handlers.wire import HandDrivenCore, WireClient, make_core
from tests.unit.broker_edge.engine.stand_ins import LOCAL_TOPIC, REMOTE_TOPIC, HeldForwarding, MemoryLog


def _cluster_core(
    replication: Replication = LOCAL_ONLY,
) -> tuple[HandDrivenCore, MemoryLog, HeldForwarding]:
    core = make_core()
    store = MemoryLog()
    forwarding = HeldForwarding()
    core.publish_path.attach_store(store, None)
    core.join_cluster(ClusterPorts(forwarding=forwarding, replication=replication))
    return core, store, forwarding


def _publisher(core: HandDrivenCore, version: int = MQTT_5) -> WireClient:
    client = core.client(version)
    client.connect("publisher")
    return client


def test_acks_keep_arrival_order_when_a_later_forwarded_batch_is_answered_first():
    """[MQTT-4.6.0-2..4] as the server keeps it: PUBACKs leave in the order the PUBLISHes came, across a
    batch appended here (durable late) and a later batch forwarded to the leader (answered early)."""
    core, store, forwarding = _cluster_core()
    client = _publisher(core)

    assert client.send(Publish(LOCAL_TOPIC, b"one", 1, packet_id=1)) == []
    assert client.send(Publish(REMOTE_TOPIC, b"two", 1, packet_id=2)) == []
    assert [topic for topic, _, _, _ in forwarding.forwarded] == [REMOTE_TOPIC]

    forwarding.answer(0)
    assert client.read() == []  # the earlier local batch is not durable yet
    store.make_durable()
    acks = client.read()
    assert [(type(a), a.packet_id) for a in acks] == [(PubAck, 1), (PubAck, 2)]
    assert len(store.logs[LOCAL_TOPIC]) == 1
    assert REMOTE_TOPIC not in store.logs  # forwarded publishes are appended by the leader only


def test_a_publisher_is_not_held_behind_another_publishers_forwarded_publish():
    """Only a publisher's own publishes keep their turn: a batch waiting for a leader elsewhere (which may
    be waiting for this broker in turn) holds back nobody else's acknowledgement."""
    core, store, forwarding = _cluster_core()
    far = _publisher(core)
    near = core.client()
    near.connect("near")

    far.send(Publish(REMOTE_TOPIC, b"far", 1, packet_id=1))
    near.send(Publish(LOCAL_TOPIC, b"near", 1, packet_id=2))
    store.make_durable()
    assert [(a.packet_id, a.reason_code) for a in near.read()] == [(2, 0)]  # a cluster: 0x00, never 0x10
    assert far.read() == []
    forwarding.answer(0)
    assert [a.packet_id for a in far.read()] == [1]


def test_a_publishers_acks_wait_for_both_the_local_and_the_forwarded_part_of_its_batch():
    core, store, forwarding = _cluster_core()
    client = _publisher(core)

    client.send(
        Publish(REMOTE_TOPIC, b"a", 1, packet_id=1),
        Publish(LOCAL_TOPIC, b"b", 2, packet_id=2),
        Publish(REMOTE_TOPIC, b"c", 1, packet_id=3),
    )
    store.make_durable()
    assert client.read() == []
    assert [len(messages) for _, messages, _, _ in forwarding.forwarded] == [2]
    forwarding.answer(0, first_offset=7)
    acks = client.read()
    assert [(type(a), a.packet_id, a.reason_code) for a in acks] == [
        (PubAck, 1, 0),
        (PubRec, 2, 0),
        (PubAck, 3, 0),
    ]
    assert [m.offset for m in forwarding.forwarded[0][1]] == [7, 8]


def test_a_refused_forward_reaches_a_v5_publisher_as_0x83_with_the_reason():
    core, store, forwarding = _cluster_core()
    client = _publisher(core)

    client.send(Publish(REMOTE_TOPIC, b"x", 1, packet_id=5))
    store.make_durable()
    _, _, _, done = forwarding.forwarded[0]
    done([ForwardAck(0x83, None, "no leader for partition 3 within forward_timeout_ms")])
    (ack,) = client.read()
    assert (type(ack), ack.packet_id, ack.reason_code) == (PubAck, 5, 0x83)
    assert ack.properties is not None
    assert ack.properties.reason_string == "no leader for partition 3 within forward_timeout_ms"


def test_too_few_in_sync_replicas_refuses_before_appending_and_closes_a_v3_publisher():
    core, store, forwarding = _cluster_core()
    forwarding.here.discard(LOCAL_TOPIC)
    forwarding.refused.add(LOCAL_TOPIC)
    v5 = _publisher(core)
    v3 = core.client(4)
    v3.connect("old-device")

    answer = v5.send(Publish(LOCAL_TOPIC, b"at risk", 2, packet_id=1))  # refused at once
    v3.send(Publish(LOCAL_TOPIC, b"at risk", 1, packet_id=2))
    store.make_durable()
    (ack,) = answer + v5.read()
    assert (type(ack), ack.packet_id, ack.reason_code) == (PubRec, 1, 0x83)
    assert ack.properties is not None and "in-sync" in (ack.properties.reason_string or "")
    assert v3.read() == [] and v3.closed  # v3 has no way to be told: never a PUBACK
    assert LOCAL_TOPIC not in store.logs


def test_a_replication_refusal_is_0x83_with_its_reason():
    class Refusing:
        def when_replicated(
            self,
            runs: Sequence[AppendedRun],
            done: Callable[[], None],
            failed: Callable[[BaseException], None],
        ) -> None:
            failed(PublishRefused("in-sync replicas fell below min_insync_replicas"))

    core, store, _forwarding = _cluster_core(Refusing())
    client = _publisher(core)
    client.send(Publish(LOCAL_TOPIC, b"x", 1, packet_id=3))
    store.make_durable()
    (ack,) = client.read()
    assert (ack.packet_id, ack.reason_code) == (3, 0x83)
    assert ack.properties is not None
    assert ack.properties.reason_string == "in-sync replicas fell below min_insync_replicas"


def test_publishes_a_peer_forwarded_are_appended_and_answered_in_turn_with_their_offsets():
    core, store, _forwarding = _cluster_core()
    answered: list[ForwardAck] = []
    messages = [Message(LOCAL_TOPIC, f"p{n}".encode(), 2, False, None, "far-device") for n in range(3)]

    core.publish_path.accept_forwarded(ForwardedBatch(messages, answered.extend))
    core.run_soon()
    assert answered == []
    store.make_durable()
    core.run_soon()
    assert answered == [ForwardAck(0, 0), ForwardAck(0, 1), ForwardAck(0, 2)]  # as QoS 1 publishes, in order
    assert [message.offset for message in messages] == [0, 1, 2]


def test_answers_to_a_peers_publishes_do_not_wait_for_a_forward_persisted_with_them():
    """Two brokers forwarding to each other must never wait on each other: the answers to publishes a peer
    forwarded here go back once they are durable (and replicated) here, although the batch they were
    persisted with holds a device's publish still waiting for that peer's answer (a topic's forwards go one
    after the other, so that answer can wait for these)."""
    core, store, forwarding = _cluster_core()
    client = _publisher(core)
    answered: list[ForwardAck] = []

    core.publish_path.accept_forwarded(ForwardedBatch([Message(LOCAL_TOPIC, b"theirs", 1)], answered.extend))
    client.send(Publish(REMOTE_TOPIC, b"mine", 1, packet_id=1))  # the same batch
    assert [topic for topic, _, _, _ in forwarding.forwarded] == [REMOTE_TOPIC]
    store.make_durable()
    core.run_soon()
    assert answered == [ForwardAck(0, 0)]
    assert client.read() == []  # its forward is not answered yet
    forwarding.answer(0)
    assert [(a.packet_id, a.reason_code) for a in client.read()] == [(1, 0)]


def test_a_peer_publish_for_a_partition_led_elsewhere_goes_to_the_port_marked_as_a_peers():
    """The port answers it (a peer's publish is never forwarded twice: ``cluster.forwarding``)."""
    core, store, forwarding = _cluster_core()
    answered: list[ForwardAck] = []

    core.publish_path.accept_forwarded(ForwardedBatch([Message(REMOTE_TOPIC, b"x", 1)], answered.extend))
    core.run_soon()
    assert [(topic, from_peer) for topic, _, from_peer, _ in forwarding.forwarded] == [(REMOTE_TOPIC, True)]
    forwarding.answer(0, reason_code=0x9C)
    store.make_durable()
    core.run_soon()
    assert [(ack.reason_code, ack.offset) for ack in answered] == [(0x9C, None)]
    assert REMOTE_TOPIC not in store.logs


def test_the_brokers_own_logged_publishes_are_forwarded_too():
    core, _store, forwarding = _cluster_core()
    core.publish_path.publish(Message(REMOTE_TOPIC, b"will", 1))
    core.run_soon()
    assert [
        (topic, [m.payload for m in messages], from_peer)
        for topic, messages, from_peer, _ in forwarding.forwarded
    ] == [(REMOTE_TOPIC, [b"will"], False)]


def test_unlogged_publishes_are_routed_here_and_broadcast_to_the_other_members():
    core, _store, forwarding = _cluster_core()
    subscriber = core.client()
    subscriber.connect("listener")
    from broker_edge.protocol.packets import Subscribe, Subscription

    subscriber.send(Subscribe(1, [Subscription("site/#", 0)]))
    client = _publisher(core)
    client.send(Publish(LOCAL_TOPIC, b"telemetry", 0))
    assert [m.payload for m in forwarding.broadcasts] == [b"telemetry"]
    (delivery,) = subscriber.read()
    assert delivery.payload == b"telemetry"


def test_a_single_broker_path_has_no_cluster_step():
    core = make_core()
    assert core.publish_path.forwarding is None
    assert "accept" not in vars(core.publish_path)  # the plain method: no per-publish cluster check


def test_a_v5_publisher_whose_publish_was_forwarded_is_sent_to_the_leader_once_acknowledged():
    """``cluster.redirect_publishers``: the publish is acknowledged, then DISCONNECT 0x9C (use another
    server, MQTT 5 3.14.2.2.2) with the leader's address as Server Reference."""
    core, _, forwarding = _cluster_core()
    forwarding.leaders[REMOTE_TOPIC] = "127.0.0.1:18830"
    client = _publisher(core)
    client.send(Publish(REMOTE_TOPIC, b"reading", 1, packet_id=4))
    forwarding.answer(0)
    answer = client.read()
    assert [type(packet).__name__ for packet in answer] == ["PubAck", "Disconnect"]
    disconnect = answer[1]
    assert disconnect.reason_code == 0x9C
    assert disconnect.properties.server_reference == "127.0.0.1:18830"
    assert client.closed


def test_a_publisher_with_a_publish_appended_here_or_of_mqtt_3_is_not_sent_elsewhere():
    core, store, forwarding = _cluster_core()
    forwarding.leaders[REMOTE_TOPIC] = "127.0.0.1:18830"
    both = _publisher(core)
    both.send(Publish(LOCAL_TOPIC, b"here", 1, packet_id=1), Publish(REMOTE_TOPIC, b"there", 1, packet_id=2))
    v3 = core.client(MQTT_3_1_1)
    v3.connect("v3")
    v3.send(Publish(REMOTE_TOPIC, b"there", 1, packet_id=3))
    store.make_durable()
    forwarding.answer(0)
    forwarding.answer(1)
    assert [type(packet).__name__ for packet in both.read()] == ["PubAck", "PubAck"]
    assert [type(packet).__name__ for packet in v3.read()] == ["PubAck"]
    assert not both.closed and not v3.closed


def test_a_publisher_appended_here_stays_while_this_member_leads_that_topic_then_follows_the_other():
    """A device publishing on a topic this member leads, in a batch of its own, then on one led elsewhere
    stays: sent to the other leader, it would be sent back by it for the first topic, and so on. Once the
    leadership of the first topic moved away, it goes at the next answer to a forwarded publish."""
    core, store, forwarding = _cluster_core()
    forwarding.leaders[REMOTE_TOPIC] = "127.0.0.1:18830"
    client = _publisher(core)
    client.send(Publish(LOCAL_TOPIC, b"here", 1, packet_id=1))
    store.make_durable()
    core.run_soon()
    assert client.read() == [PubAck(1)]
    for n in range(2):
        client.send(Publish(REMOTE_TOPIC, b"there", 1, packet_id=2 + n))
        forwarding.answer(n)
        assert client.read() == [PubAck(2 + n)]
    assert not client.closed
    forwarding.here.discard(LOCAL_TOPIC)  # its leadership moved to another member
    client.send(Publish(REMOTE_TOPIC, b"there again", 1, packet_id=4))
    forwarding.answer(2)
    answer = client.read()
    assert [type(packet).__name__ for packet in answer] == ["PubAck", "Disconnect"]
    assert answer[1].properties.server_reference == "127.0.0.1:18830"


def test_a_publisher_on_topics_led_here_and_elsewhere_in_turn_stays():
    """A device publishing each time on a topic led here and on two led by two other members, their
    forwards answered one after the other, or on the one led here and one led elsewhere in turns, never
    goes: it would go back and forth between the members."""
    core, store, forwarding = _cluster_core()
    other = "site/led-by-a-third"
    forwarding.leaders[REMOTE_TOPIC] = "127.0.0.1:18830"
    forwarding.leaders[other] = "127.0.0.1:18831"
    client = _publisher(core)
    answered = 0
    for n in range(3):
        client.send(
            Publish(LOCAL_TOPIC, b"here", 1, packet_id=3 * n + 1),
            Publish(REMOTE_TOPIC, b"there", 1, packet_id=3 * n + 2),
            Publish(other, b"further", 1, packet_id=3 * n + 3),
        )
        store.make_durable()
        core.run_soon()
        forwarding.answer(answered)
        forwarding.answer(answered + 1)
        answered += 2
        assert client.read() == [PubAck(3 * n + 1), PubAck(3 * n + 2), PubAck(3 * n + 3)]
    for n in range(3):
        client.send(Publish(LOCAL_TOPIC, b"here", 1, packet_id=10 + 2 * n))
        store.make_durable()
        core.run_soon()
        assert client.read() == [PubAck(10 + 2 * n)]
        client.send(Publish(REMOTE_TOPIC, b"there", 1, packet_id=11 + 2 * n))
        forwarding.answer(answered)
        answered += 1
        assert client.read() == [PubAck(11 + 2 * n)]
    assert not client.closed


def test_a_publisher_whose_leader_runs_on_this_host_is_handed_over_rather_than_sent_away():
    """``cluster.hand_over_connections``: once its forwarded publish is acknowledged, an MQTT 3.1.1 and an
    MQTT 5 publisher alike are handed to the leader on this host (no DISCONNECT, even with
    ``redirect_publishers``), once each; one with a publish appended here, or with answers still to
    write, is not."""
    core, store, forwarding = _cluster_core()
    forwarding.leaders[REMOTE_TOPIC] = "127.0.0.1:18830"
    forwarding.on_this_host.add(REMOTE_TOPIC)
    v3 = core.client(MQTT_3_1_1)
    v3.connect("v3")
    v3.send(Publish(REMOTE_TOPIC, b"one", 1, packet_id=1), Publish(REMOTE_TOPIC, b"two", 1, packet_id=2))
    v5 = _publisher(core)
    v5.send(Publish(REMOTE_TOPIC, b"three", 1, packet_id=3))
    both = core.client(MQTT_3_1_1)
    both.connect("both")
    both.send(Publish(LOCAL_TOPIC, b"here", 1, packet_id=4), Publish(REMOTE_TOPIC, b"there", 1, packet_id=5))
    store.make_durable()
    forwarding.answer(0)
    forwarding.answer(1)
    forwarding.answer(2)
    assert v3.read() == [PubAck(1), PubAck(2)]
    assert v5.read() == [PubAck(3)]
    assert both.read() == [PubAck(4), PubAck(5)]
    assert [(topic, publisher) for topic, publisher in forwarding.handed_over] == [
        (REMOTE_TOPIC, v3.conn),
        (REMOTE_TOPIC, v5.conn),
    ]
    assert not v3.closed and not v5.closed and not both.closed


def test_a_publisher_that_stays_does_not_keep_the_next_one_of_its_batch_from_moving():
    """Without ``redirect_publishers``, an MQTT 5 publisher that may not move (it subscribes) is passed
    over, and the MQTT 3.1.1 one answered after it in the same batch is still handed over."""
    core, _, forwarding = _cluster_core()
    forwarding.on_this_host.add(REMOTE_TOPIC)
    staying, moving = _publisher(core), core.client(MQTT_3_1_1)
    moving.connect("v3")
    forwarding.stays = {id(staying.conn)}
    staying.conn.receive(encode(Publish(REMOTE_TOPIC, b"one", 1, packet_id=1), MQTT_5))
    moving.conn.receive(encode(Publish(REMOTE_TOPIC, b"two", 1, packet_id=2), MQTT_3_1_1))
    core.run_soon()  # one batch: both publishes forwarded together
    assert len(forwarding.forwarded) == 1
    forwarding.answer(0)
    assert forwarding.handed_over == [(REMOTE_TOPIC, moving.conn)]
    assert not staying.closed and not moving.closed


def test_a_qos_2_publisher_is_sent_to_the_leader_once_its_flow_ends_with_pubcomp():
    """A QoS 2 publish forwarded and answered leaves its flow open: PUBREC, and the PUBREL still to come,
    which the client may send only where it published [MQTT-4.3.3-2]. It is sent to the leader once that
    flow ends: PUBCOMP, then DISCONNECT 0x9C with the leader's address. It stayed where it was, each of its
    publishes forwarded, for as long as it published QoS 2."""
    core, _, forwarding = _cluster_core()
    forwarding.leaders[REMOTE_TOPIC] = "127.0.0.1:18830"
    client = _publisher(core)
    client.send(Publish(REMOTE_TOPIC, b"reading", 2, packet_id=7))
    forwarding.answer(0)
    assert client.read() == [PubRec(7)]
    assert not client.closed
    answer = client.send(PubRel(7))
    assert [type(packet).__name__ for packet in answer] == ["PubComp", "Disconnect"]
    assert answer[0].packet_id == 7
    assert answer[1].reason_code == 0x9C
    assert answer[1].properties.server_reference == "127.0.0.1:18830"
    assert client.closed


def test_a_qos_2_publisher_is_handed_over_once_its_last_open_flow_ends_and_not_if_it_appended_here():
    """``cluster.hand_over_connections``: an MQTT 3.1.1 QoS 2 publisher goes once none of its flows is open
    (two were), not at the first PUBCOMP; one that meanwhile published on a topic this member leads stays."""
    core, store, forwarding = _cluster_core()
    forwarding.on_this_host.add(REMOTE_TOPIC)
    moving = core.client(MQTT_3_1_1)
    moving.connect("moving")
    moving.send(Publish(REMOTE_TOPIC, b"one", 2, packet_id=1), Publish(REMOTE_TOPIC, b"two", 2, packet_id=2))
    staying = core.client(MQTT_3_1_1)
    staying.connect("staying")
    staying.send(Publish(REMOTE_TOPIC, b"three", 2, packet_id=3))
    forwarding.answer(0)
    forwarding.answer(1)
    assert moving.read() == [PubRec(1), PubRec(2)]
    assert staying.read() == [PubRec(3)]
    staying.send(Publish(LOCAL_TOPIC, b"here", 1, packet_id=4))
    store.make_durable()
    core.run_soon()
    assert staying.read() == [PubAck(4)]
    assert forwarding.handed_over == []
    assert [packet.packet_id for packet in moving.send(PubRel(1))] == [1]
    assert forwarding.handed_over == []  # its second flow is still open
    assert [packet.packet_id for packet in moving.send(PubRel(2))] == [2]
    assert [packet.packet_id for packet in staying.send(PubRel(3))] == [3]
    assert forwarding.handed_over == [(REMOTE_TOPIC, moving.conn)]


def _alone() -> tuple[HandDrivenCore, MemoryLog, WireClient, WireClient, WireClient]:
    """A broker alone with its log, a QoS 1 reader of ``plant/a``, an MQTT 5 and an MQTT 3.1.1 publisher."""
    core = make_core()
    store = MemoryLog()
    core.publish_path.attach_store(store, None)
    reader = core.client(MQTT_3_1_1)
    reader.connect("reader")
    reader.send(Subscribe(1, [Subscription("plant/a", 1)]))
    new, old = core.client(MQTT_5), core.client(MQTT_3_1_1)
    new.connect("new")
    old.connect("old")
    return core, store, reader, new, old


def test_a_broker_alone_acknowledges_a_durable_batch_in_each_publishers_order():
    """[MQTT-4.6.0-2] A batch's PUBACKs, written per publisher in runs once it is durable, leave in the
    order of that publisher's PUBLISHes, with no subscriber matched (0x10) told to MQTT 5 only."""
    _core, store, reader, new, old = _alone()
    new.send(
        Publish("plant/a", b"1", 1, packet_id=1),
        Publish("plant/b", b"2", 1, packet_id=2),
        Publish("plant/a", b"3", 1, packet_id=3),
    )
    old.send(Publish("plant/b", b"4", 1, packet_id=7), Publish("plant/a", b"5", 1, packet_id=8))
    assert new.read() == [] and old.read() == [], "nothing is acknowledged before it is durable"
    store.make_durable()
    assert new.read() == [PubAck(1), PubAck(2, 0x10), PubAck(3)]
    assert old.read() == [PubAck(7), PubAck(8)]
    assert [p.payload for p in reader.read() if isinstance(p, Publish)] == [b"1", b"3", b"5"]
    assert new.conn.incoming_pending == 0 and old.conn.incoming_pending == 0


def test_a_failed_write_refuses_every_publish_of_its_batch():
    """A write or fsync that failed acknowledges none of its batch: MQTT 5 publishers get 0x80 for each
    publish, an MQTT 3.1.1 publisher (which cannot be told) is closed, and nothing is delivered."""
    _core, store, reader, new, old = _alone()
    new.send(Publish("plant/a", b"1", 1, packet_id=1), Publish("plant/b", b"2", 1, packet_id=2))
    old.send(Publish("plant/a", b"3", 1, packet_id=5))
    store.fail(StorageFailed("log write failed: [Errno 5] Input/output error"))
    assert new.read() == [PubAck(1, 0x80), PubAck(2, 0x80)]
    assert old.closed
    assert reader.read() == []
