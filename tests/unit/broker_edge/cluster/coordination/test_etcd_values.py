"""Values read from etcd are checked before anything acts on them; a bad one is named, reported, ignored."""

from __future__ import annotations

import json
import logging

import pytest

from broker_edge.cluster.coordination.etcd import ClusterKeys, KeyValue
from broker_edge.cluster.coordination.etcd_values import (
    MAX_EPOCH,
    BadValue,
    BadValues,
    check_progress,
    load_json,
    parse_config,
    parse_controller,
    parse_member,
    parse_partition_state,
    read_cluster,
)
from broker_edge.placement import Member, PartitionState

MEMBER = {
    "node_id": "b1",
    "mqtt": "10.0.0.21:1883",
    "offsets_api": "https://10.0.0.21:9884",
    "peer": "https://10.0.0.21:9885",
}
STATE = {"partition": 3, "leader": "b2", "epoch": 7, "replicas": ["b1", "b2", "b3"], "isr": ["b2", "b3"]}


def encoded(document: object) -> bytes:
    return json.dumps(document).encode()


def test_a_member_record_is_read_with_its_addresses() -> None:
    member = parse_member("b1", encoded(MEMBER))
    assert member == Member("b1", "10.0.0.21:1883", "https://10.0.0.21:9884", "https://10.0.0.21:9885")
    assert parse_member("b1", member.to_json().encode()) == member
    handoff = "timestone-handoff-" + "5e" * 16
    with_handoff = parse_member("b1", encoded({**MEMBER, "handoff": handoff}))
    assert with_handoff.handoff == handoff
    assert parse_member("b1", with_handoff.to_json().encode()) == with_handoff


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"node_id": "b2"}, "names 'b2'"),  # a record under another node's key
        ({"node_id": "../b1"}, "node_id"),
        ({"mqtt": "10.0.0.21"}, "mqtt"),
        ({"mqtt": "10.0.0.21:99999"}, "mqtt"),
        ({"offsets_api": "ftp://10.0.0.21:9884"}, "offsets_api"),
        ({"offsets_api": "http://user:pw@10.0.0.21:9884"}, "offsets_api"),
        ({"peer": "https://10.0.0.21"}, "peer"),
        ({"peer": 9885}, "peer"),
        ({"handoff": "/tmp/handoff.sock"}, "handoff"),  # no path: an abstract socket's name only
        ({"handoff": "timestone-handoff-short"}, "handoff"),
        ({"handoff": 7}, "handoff"),
    ],
)
def test_a_member_record_that_is_not_one_is_refused_naming_the_field(change: dict, named: str) -> None:
    with pytest.raises(BadValue, match=named):
        parse_member("b1", encoded({**MEMBER, **change}))


def test_a_partition_record_is_read_and_its_invariants_hold() -> None:
    state = parse_partition_state(3, encoded(STATE), 16)
    assert state == PartitionState(3, "b2", 7, ("b1", "b2", "b3"), ("b2", "b3"))
    offline = parse_partition_state(3, encoded({**STATE, "leader": None}), 16)
    assert offline.leader is None


@pytest.mark.parametrize(
    ("change", "partitions", "named"),
    [
        ({"epoch": 2**64}, 16, "epoch"),  # past int64: once left partitions without a leader
        ({"epoch": MAX_EPOCH + 1}, 16, "epoch"),
        ({"epoch": -1}, 16, "epoch"),
        ({"epoch": True}, 16, "epoch"),
        ({"epoch": "7"}, 16, "epoch"),
        ({"partition": 4}, 16, "partition"),
        ({}, 3, "3 partitions"),  # the record of a partition the cluster does not have
        ({"leader": "b9"}, 16, "not one of its in-sync replicas"),
        ({"isr": ["b2", "b4"]}, 16, "not replicas"),
        ({"replicas": []}, 16, "empty"),
        ({"replicas": ["b1", "b1", "b2"]}, 16, "twice"),
        ({"replicas": ["b1", 2]}, 16, "replicas"),
    ],
)
def test_a_partition_record_out_of_range_is_refused_naming_the_field(
    change: dict, partitions: int, named: str
) -> None:
    with pytest.raises(BadValue, match=named):
        parse_partition_state(3, encoded({**STATE, **change}), partitions)


@pytest.mark.parametrize(
    "value",
    [b"{not json", b"\xff\xfe", b"[1, 2]", b"null", b"[" * 100_000 + b"]" * 100_000, b"x" * (3 << 20)],
)
def test_bytes_that_are_no_json_object_are_refused_not_raised_as_anything_else(value: bytes) -> None:
    with pytest.raises(BadValue):
        load_json(value, "partition 3")
    with pytest.raises(BadValue):
        parse_partition_state(3, value, 16)


@pytest.mark.parametrize(
    ("epoch", "shown"),
    [(b"1e400", "got inf"), (b"NaN", "got nan"), (b"7.0", "got 7.0"), (b"-Infinity", "got -inf")],
)
def test_a_number_json_cannot_give_as_an_integer_is_refused_naming_the_field(
    epoch: bytes, shown: str
) -> None:
    value = encoded(STATE).replace(b'"epoch": 7', b'"epoch": ' + epoch)
    assert value != encoded(STATE)
    with pytest.raises(BadValue, match=f"partition 3.epoch must be an integer, {shown}"):
        parse_partition_state(3, value, 16)


def test_epochs_never_go_back_and_one_epoch_names_one_leader() -> None:
    held = PartitionState(3, "b2", 7, ("b1", "b2"), ("b1", "b2"))
    check_progress(held, PartitionState(3, "b1", 8, ("b1", "b2"), ("b1",)))  # an election
    check_progress(held, PartitionState(3, "b2", 7, ("b1", "b2"), ("b2",)))  # an in-sync set change
    with pytest.raises(BadValue, match="goes back"):
        check_progress(held, PartitionState(3, "b2", 6, ("b1", "b2"), ("b1", "b2")))
    with pytest.raises(BadValue, match="b2'"):
        check_progress(held, PartitionState(3, "b1", 7, ("b1", "b2"), ("b1", "b2")))
    check_progress(None, held)


def test_the_stored_partition_count_must_be_the_configured_one() -> None:
    assert parse_config(b'{"partitions": 16}', 16) == 16
    with pytest.raises(BadValue, match=r"within \[1, 4096\]"):
        parse_config(b'{"partitions": 0}', 16)  # once made every QoS 1 publish hang
    with pytest.raises(BadValue, match="32 stored, 16 configured"):
        parse_config(b'{"partitions": 32}', 16)
    assert parse_config(b'{"partitions": 32}', None) == 32  # a tool without a configuration


def test_the_controller_key_names_a_node() -> None:
    assert parse_controller(b"b1") == "b1"
    for value in (b"", b"\xff", b"b1/../x", b"a" * 100):
        with pytest.raises(BadValue):
            parse_controller(value)


def test_bad_values_are_logged_once_per_key_and_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    bad = BadValues(interval_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.ERROR, "broker_edge.cluster.etcd_values"):
        for _ in range(100):
            bad.report("/t/partitions/3", BadValue("partition 3.epoch: out of range"))
        bad.report("/t/partitions/4", BadValue("partition 4.epoch: out of range"))
        now[0] = 61
        bad.report("/t/partitions/3", BadValue("partition 3.epoch: out of range"))
    assert bad.count == 102
    assert [record.getMessage().split(":")[0] for record in caplog.records] == [
        "ignoring etcd key /t/partitions/3",
        "ignoring etcd key /t/partitions/4",
        "ignoring etcd key /t/partitions/3",
    ]


def test_one_read_of_the_cluster_keeps_every_good_value_and_lists_the_bad_partitions() -> None:
    keys = ClusterKeys("/t")
    kvs = [
        KeyValue("/t/config", b'{"partitions": 4}', 2, 0),
        KeyValue("/t/controller", b"b1", 3, 7),
        KeyValue("/t/members/b1", encoded(MEMBER), 4, 7),
        KeyValue("/t/members/evil", b"{", 5, 0),
        KeyValue("/t/partitions/0", encoded({**STATE, "partition": 0}), 6, 0),
        KeyValue("/t/partitions/1", b"garbage", 8, 0),
        KeyValue("/t/partitions/2", encoded({**STATE, "partition": 2, "epoch": 2**64}), 9, 0),
        KeyValue("/t/sessions/device-1", b"{}", 10, 0),
    ]
    bad = BadValues()
    stored = read_cluster(kvs, keys, 4, bad)
    assert stored.partitions == 4 and stored.config_present
    assert stored.controller == "b1"
    assert set(stored.members) == {"b1"}
    assert set(stored.states) == {0} and stored.revisions == {0: 6}
    assert stored.unreadable == {1, 2}
    assert bad.count == 3
    mismatched = read_cluster(kvs, keys, 16, BadValues())
    assert mismatched.partitions is None and mismatched.config_present  # not created again over
    assert read_cluster(kvs, keys, None, BadValues()).partitions == 4  # the stored count, for tools
