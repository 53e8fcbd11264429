"""The pure parts of cluster-wide shared subscriptions: which brokers a topic's groups have, which broker
gets the next message, the deliveries in flight and the finished ones, and their wire formats."""

from __future__ import annotations

import struct

import pytest

from broker_edge.cluster.features.shared_directory import Deliveries, DeliveryKey, SharedDirectory, choose
from broker_edge.cluster.features.shared_groups_wire import (
    DECLINED_TOO_LARGE,
    decode_assign,
    decode_assigned,
    decode_direct,
    decode_done,
    decode_moved,
    decode_note,
    decode_onward,
    decode_partitions,
    encode_assign,
    encode_assigned,
    encode_direct,
    encode_done,
    encode_moved,
    encode_note,
    encode_onward,
    encode_partitions,
)
from broker_edge.cluster.features.shared_registry import decode_groups, encode_groups
from broker_edge.engine.message import Message
from broker_edge.protocol.properties import Properties


def test_a_topic_matches_the_groups_of_every_broker_with_members_and_a_broker_leaving_takes_its_own():
    directory = SharedDirectory()
    directory.replace("a", {("workers", "jobs/#"), ("audit", "jobs/+/done")})
    directory.replace("b", {("workers", "jobs/#")})
    groups = {(g.name, g.filter): set(g.members) for g in directory.match("jobs/7/done")}
    assert groups == {("workers", "jobs/#"): {"a", "b"}, ("audit", "jobs/+/done"): {"a"}}
    assert directory.match("other") == []

    directory.replace("a", {("workers", "jobs/#")})  # a's last audit member left
    assert [(g.name, set(g.members)) for g in directory.match("jobs/7/done")] == [("workers", {"a", "b"})]
    directory.remove("b")
    assert [set(g.members) for g in directory.match("jobs/1")] == [{"a"}]
    assert directory.group(("audit", "jobs/+/done")) is None


def test_brokers_are_chosen_round_robin_and_never_one_that_cannot_be_used():
    directory = SharedDirectory()
    for node in "abc":
        directory.replace(node, {("g", "t")})
    group = directory.group(("g", "t"))
    assert [choose(group, lambda node: True) for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]
    assert {choose(group, lambda node: node != "b") for _ in range(6)} == {"a", "c"}
    assert choose(group, lambda node: False) is None  # unlike a broker's own members: never a down one
    assert choose(None, lambda node: True) is None


KEY = DeliveryKey("jobs/1", 41, "workers", "jobs/#")


def test_a_finished_delivery_is_never_assigned_again_and_is_forgotten_oldest_first():
    deliveries = Deliveries(remembered=2)
    assert not deliveries.known(KEY)
    assert deliveries.assign(KEY, "a")
    assert deliveries.known(KEY) and len(deliveries) == 1
    deliveries.finish(KEY)
    assert not deliveries.assign(KEY, "b")  # a late note of it changes nothing
    assert deliveries.known(KEY) and len(deliveries) == 0
    deliveries.finish(DeliveryKey("jobs/1", 42, "workers", "jobs/#"))
    deliveries.finish(DeliveryKey("jobs/1", 43, "workers", "jobs/#"))
    assert not deliveries.known(KEY)  # the oldest of more than `remembered`


def test_orphans_are_the_deliveries_of_gone_or_declining_brokers_in_partitions_led_here():
    deliveries = Deliveries(remembered=10)
    mine_dead = DeliveryKey("led/1", 1, "g", "#")
    mine_alive = DeliveryKey("led/2", 2, "g", "#")
    mine_declined = DeliveryKey("led/3", 3, "g", "#")
    elsewhere_dead = DeliveryKey("other/1", 4, "g", "#")
    deliveries.assign(mine_dead, "c")
    deliveries.assign(mine_alive, "b")
    deliveries.assign(mine_declined, "b")
    deliveries.assign(elsewhere_dead, "c")
    assert deliveries.decline(mine_declined, "b") == {"b"}
    orphans = deliveries.orphans(lambda node: node != "c", lambda topic: topic.startswith("led/"))
    assert set(orphans) == {mine_dead, mine_declined}
    partitions = {"led/1": 0, "led/2": 0, "led/3": 0, "other/1": 1}
    assert set(deliveries.in_partitions(partitions.__getitem__, {0})) == {(mine_dead, "c"), (mine_alive, "b")}


def test_every_part_and_request_round_trips():
    props = Properties(user_properties=[("k", "v")], correlation_data=b"c")
    message = Message("jobs/1", b"payload", 2, True, props, "device-9", None, 100.0 + 20)
    key, decoded = decode_assign(encode_assign(KEY, message), now=500.0)
    assert key == KEY
    assert (decoded.topic, decoded.payload, decoded.qos, decoded.retain, decoded.origin) == (
        "jobs/1",
        b"payload",
        2,
        True,
        "device-9",
    )
    assert decoded.offset == 41
    assert decoded.properties is not None and decoded.properties.user_properties == [("k", "v")]
    assert decode_note(encode_note(KEY, "b")) == (KEY, "b")
    assert decode_done(encode_done(KEY, True)) == (KEY, True)
    assert decode_done(encode_done(KEY, False)) == (KEY, False)
    assert decode_done(encode_done(KEY, DECLINED_TOO_LARGE)) == (KEY, DECLINED_TOO_LARGE)
    assert DECLINED_TOO_LARGE & 1  # a broker that knows only 0 and 1 reads it as declined
    group, topic_filter, direct = decode_direct(encode_direct("g", "t/#", Message("t/x", b"q0")), now=1.0)
    assert (group, topic_filter, direct.topic, direct.payload, direct.qos) == ("g", "t/#", "t/x", b"q0", 0)
    tried, group, topic_filter, onward = decode_onward(
        encode_onward({"b", "a"}, "g", "t/#", Message("t/x", b"big")), now=1.0
    )
    assert (tried, group, topic_filter) == ({"a", "b"}, "g", "t/#")
    assert (onward.topic, onward.payload) == ("t/x", b"big")
    moved = decode_moved(encode_moved(message), now=500.0)
    assert (moved.topic, moved.payload, moved.qos, moved.origin) == ("jobs/1", b"payload", 2, "device-9")
    assert decode_partitions(encode_partitions({3, 1, 15})) == {1, 3, 15}
    entries = [(KEY, "a"), (DeliveryKey("é/ü", 0, "g", "#"), "b")]
    assert decode_assigned(encode_assigned(entries)) == entries


def test_a_truncated_part_is_an_error_not_a_wrong_answer():
    body = encode_note(KEY, "node-b")
    with pytest.raises((ValueError, struct.error)):
        decode_note(body[:-3])


def test_the_registry_value_lists_a_brokers_groups_and_refuses_anything_else():
    groups = {("workers", "jobs/#"), ("audit", "a/+")}
    assert decode_groups(encode_groups(groups)) == groups
    with pytest.raises(ValueError):
        decode_groups(b'["workers"]')
