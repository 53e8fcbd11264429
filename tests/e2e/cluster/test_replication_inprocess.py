"""The replicated log across real brokers in one process (static partition states, no etcd).

Devices are real MQTT clients (paho) on real brokers; followers open their sessions over the real offsets
API and leaders push them over the real peer links. What is proved: identical offsets and segment bytes
on every replica (over either transport), acknowledgement only once the in-sync set holds a publish,
refusal under `min_insync_replicas`, a follower leaving and rejoining the in-sync set, truncation of a
diverged tail under a new leader, the watermark gating readers and subscribers, a steady state without
fetches, and the fall back to fetching when a peer link drops.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from broker_edge.cluster.replication.fetcher import FollowerConfig
from broker_edge.cluster.replication.replica_fetch import (
    OK,
    PATH,
    FetchRequest,
    PartitionFetch,
    TopicPosition,
    decode_response,
    encode_request,
)
from broker_edge.cluster.replication.stage import LeaderConfig
from broker_edge.placement import PartitionState, partition_of
from broker_edge.storage import LogStore
from tests.e2e.broker_clients import PahoClient, close_all, wait_for
from tests.e2e.cluster.inprocess_cluster import InProcessCluster

pytestmark = pytest.mark.timeout(90)

TOPIC = "site/line-1/temperature"
NODES = ("b1", "b2", "b3")


def _all_in_sync(leader: str = "b1", epoch: int = 1) -> PartitionState:
    return PartitionState(0, leader, epoch, NODES, NODES)


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Any]:
    made: list[InProcessCluster] = []

    def make(**options: Any) -> InProcessCluster:
        cluster = InProcessCluster(tmp_path, NODES, **options)
        made.append(cluster)
        return cluster

    yield make
    close_all()
    for cluster in made:
        cluster.close()


class AckWatcher:
    """A v5 publisher recording each PUBACK's reason code by message id."""

    def __init__(self, port: int, client_id: str) -> None:
        self.client = PahoClient(port, client_id)
        self.acks: queue.Queue[tuple[int, int]] = queue.Queue()
        self.client.client.on_publish = lambda c, u, mid, reason, props: self.acks.put((mid, reason.value))

    def publish(self, payload: bytes) -> int:
        return self.client.client.publish(TOPIC, payload, qos=1).mid

    def ack(self, timeout: float) -> tuple[int, int] | None:
        try:
            return self.acks.get(timeout=timeout)
        except queue.Empty:
            return None


@pytest.mark.parametrize("peer_links", [True, False], ids=["pushed", "fetched"])
def test_every_replica_holds_the_same_records_at_the_same_offsets_byte_for_byte(make_cluster, peer_links):
    cluster = make_cluster(storage={"segment_bytes": 4096}, peer_links=peer_links)
    cluster.start_replication([_all_in_sync()])
    subscriber = PahoClient(cluster["b3"].port, "watcher")
    subscriber.subscribe(TOPIC, qos=1)
    device = PahoClient(cluster["b1"].port, "device-1")
    sent = [f"reading-{n:04d}-".encode() * 8 for n in range(200)]
    for payload in sent:
        device.publish(TOPIC, payload, qos=1)  # returns once acknowledged
    # acknowledged means every in-sync replica holds it durably
    assert all(cluster[node].durable_end(TOPIC) == 200 for node in NODES)
    received = [message.payload for message in subscriber.expect(200)]
    assert received == sent  # routed on a follower once committed, once each, in order
    frames = cluster["b1"].frames(TOPIC)
    assert len(frames) == 200
    assert cluster["b2"].frames(TOPIC) == frames  # the same records at the same offsets, byte for byte
    assert cluster["b3"].frames(TOPIC) == frames
    assert wait_for(lambda: all(cluster[node].committed_end(TOPIC) == 200 for node in NODES))
    assert cluster["b2"].payloads(TOPIC) == list(enumerate(sent))


def test_a_publish_is_acknowledged_only_once_the_in_sync_replicas_hold_it(make_cluster):
    cluster = make_cluster()
    cluster.start_replication([_all_in_sync()])
    cluster.run(cluster["b3"].stop_followers())  # b3 stays in the in-sync set but fetches nothing
    publisher = AckWatcher(cluster["b1"].port, "device-2")
    publisher.publish(b"held")
    assert publisher.ack(timeout=1.0) is None
    assert cluster["b2"].durable_end(TOPIC) == 1  # b2 has it, b3 does not: not acknowledged
    assert cluster["b3"].durable_end(TOPIC) == 0
    assert cluster["b1"].committed_end(TOPIC) == 0
    cluster.call(cluster["b3"].start_followers)
    mid, reason = publisher.ack(timeout=5.0) or (None, None)
    assert mid is not None and reason is not None and reason < 0x80  # success (0x10: no match)
    assert cluster["b3"].durable_end(TOPIC) == 1


def test_fewer_in_sync_replicas_than_the_minimum_refuses_and_never_acknowledges(make_cluster):
    cluster = make_cluster()
    cluster.isr.expansions_allowed = False  # the followers catch up at once: they would rejoin the ISR
    cluster.start_replication([PartitionState(0, "b1", 1, NODES, ("b1",))])
    watchers = [PahoClient(cluster[node].port, f"watcher-{node}") for node in ("b1", "b2")]
    for watcher in watchers:
        watcher.subscribe(TOPIC, qos=1)
    publisher = AckWatcher(cluster["b1"].port, "device-3")
    publisher.publish(b"at risk")
    mid, reason = publisher.ack(timeout=5.0) or (None, 0)
    assert mid is not None and reason >= 0x80  # a v5 refusal, not a success
    # refused is not erased: the record is in the log of the in-sync set (here the leader alone), so every
    # broker's subscribers get it, the leader's included (a device resending it makes a duplicate)
    for watcher in watchers:
        assert [m.payload for m in watcher.expect(1)] == [b"at risk"]
    v3 = PahoClient(cluster["b1"].port, "device-3-v3", version=4)
    v3.client.publish(TOPIC, b"at risk too", qos=1)
    assert v3.disconnects.get(timeout=5) is not None  # v3.1.1 cannot be told: the connection closes


def test_a_follower_stopped_and_restarted_leaves_and_rejoins_the_in_sync_set(make_cluster):
    cluster = make_cluster(leader_config=LeaderConfig(min_insync_replicas=2, replica_lag_max_ms=600))
    cluster.start_replication([_all_in_sync()])
    device = PahoClient(cluster["b1"].port, "device-4")
    device.publish(TOPIC, b"before", qos=1)
    # b3 goes once it holds that record and every replica is in sync: on a loaded machine the followers may
    # have lagged past replica_lag_max_ms a moment (out of the in-sync set, the publish refused, as it must)
    assert wait_for(
        lambda: cluster["b3"].durable_end(TOPIC) == 1 and set(cluster.state().isr) == set(NODES), timeout=10
    )
    cluster.run(cluster["b3"].stop_followers())
    assert wait_for(lambda: cluster.state().isr == ("b1", "b2"), timeout=5)
    for number in range(50):  # acknowledged by b1 and b2 while b3 is away
        device.publish(TOPIC, f"while away {number}".encode(), qos=1)
    assert cluster["b3"].durable_end(TOPIC) == 1
    cluster.call(cluster["b3"].start_followers)
    assert wait_for(lambda: set(cluster.state().isr) == set(NODES), timeout=10)
    assert cluster["b3"].durable_end(TOPIC) == 51
    assert cluster["b3"].frames(TOPIC) == cluster["b1"].frames(TOPIC)
    assert ("shrink", 0, "b3") in cluster.isr.changes and ("expand", 0, "b3") in cluster.isr.changes


def test_a_replica_truncates_records_past_the_last_acknowledged_one_under_a_new_leader(make_cluster):
    cluster = make_cluster()
    _device, stranded = _strand_on_leader(cluster, acknowledged=5, stranded=3, first_device=5)
    assert stranded.ack(timeout=0.5) is None
    # b1 is cut off; b2 becomes leader under epoch 2 (b1 still runs and learns it, as after a lease loss)
    cluster.set_state(PartitionState(0, "b2", 2, NODES, ("b2", "b3")))
    mid, reason = stranded.ack(timeout=5) or (None, 0)
    assert mid is not None and reason >= 0x80  # refused by the former leader, never acknowledged
    for node in ("b2", "b3"):
        cluster.call(cluster[node].start_followers)
    new_device = PahoClient(cluster["b2"].port, "device-7")
    for number in range(2):
        new_device.publish(TOPIC, f"new leader {number}".encode(), qos=1)
    assert wait_for(lambda: cluster["b1"].durable_end(TOPIC) == 7, timeout=10)
    expected = [(n, f"acknowledged {n}".encode()) for n in range(5)]
    expected += [(5 + n, f"new leader {n}".encode()) for n in range(2)]
    assert wait_for(lambda: cluster["b1"].payloads(TOPIC) == expected, timeout=10)
    assert cluster["b1"].frames(TOPIC) == cluster["b2"].frames(TOPIC)
    assert wait_for(lambda: set(cluster.state().isr) == set(NODES), timeout=10)  # b1 rejoins


def test_the_high_watermark_gates_readers_and_subscribers_of_every_replica(make_cluster):
    cluster = make_cluster(follower_config=FollowerConfig(wait_ms=200))
    cluster.start_replication([_all_in_sync()])
    cluster.run(cluster["b3"].stop_followers())
    subscriber = PahoClient(cluster["b2"].port, "watcher-2")
    subscriber.subscribe(TOPIC, qos=1)
    publisher = AckWatcher(cluster["b1"].port, "device-8")
    publisher.publish(b"not yet committed")
    assert wait_for(lambda: cluster["b2"].durable_end(TOPIC) == 1)
    subscriber.expect_none(timeout=0.5)
    assert cluster["b2"].payloads(TOPIC) == []  # durable on b2, invisible to its readers
    assert cluster["b1"].payloads(TOPIC) == []
    cluster.call(cluster["b3"].start_followers)
    assert subscriber.expect(1)[0].payload == b"not yet committed"
    assert cluster["b2"].payloads(TOPIC) == [(0, b"not yet committed")]
    assert publisher.ack(timeout=5) is not None


def test_a_broker_outside_the_replicas_observes_committed_records_without_a_log(make_cluster):
    cluster = make_cluster()
    cluster.start_replication([PartitionState(0, "b1", 1, ("b1", "b2"), ("b1", "b2"))])
    subscriber = PahoClient(cluster["b3"].port, "watcher-3")
    subscriber.subscribe(TOPIC, qos=1)
    time.sleep(0.3)  # the observer's session starts at the current end
    device = PahoClient(cluster["b1"].port, "device-9")
    for number in range(20):
        device.publish(TOPIC, f"observed {number}".encode(), qos=1)
    received = [message.payload for message in subscriber.expect(20)]
    assert received == [f"observed {number}".encode() for number in range(20)]
    assert cluster["b3"].durable_end(TOPIC) == 0  # routed, not persisted
    subscriber.expect_none(timeout=0.3)


def _pushed(cluster: InProcessCluster, node: str) -> bool:
    """Whether `node`'s replica session with b1 is served over the peer link."""

    def check() -> bool:
        followers = cluster[node].followers
        assert followers is not None
        fetcher = followers._fetchers.get(("b1", False))
        return fetcher is not None and fetcher.pushes is not None

    return cluster.call(check)


def _counts(cluster: InProcessCluster) -> tuple[int, int]:
    """(HTTP fetches served, pushes sent) by the leader b1."""
    leader = cluster["b1"].leader
    assert leader is not None
    return cluster.call(lambda: (leader.fetches_served, leader.pushes_sent))


def test_in_the_steady_state_records_and_watermarks_are_pushed_without_any_fetch(make_cluster):
    cluster = make_cluster(storage={"segment_bytes": 4096})
    cluster.start_replication([_all_in_sync()])
    subscriber = PahoClient(cluster["b3"].port, "watcher-push")
    subscriber.subscribe(TOPIC, qos=1)
    device = PahoClient(cluster["b1"].port, "device-push")
    device.publish(TOPIC, b"first", qos=1)
    assert wait_for(lambda: _pushed(cluster, "b2") and _pushed(cluster, "b3"))
    fetches, pushes = _counts(cluster)
    sent = [f"pushed-{n:04d}-".encode() * 8 for n in range(150)]
    for payload in sent:
        device.publish(TOPIC, payload, qos=1)  # acknowledged: every in-sync replica holds it durably
    assert all(cluster[node].durable_end(TOPIC) == 151 for node in NODES)
    assert [m.payload for m in subscriber.expect(151)] == [b"first", *sent]  # routed on b3 once committed
    assert wait_for(lambda: all(cluster[node].committed_end(TOPIC) == 151 for node in NODES))
    after_fetches, after_pushes = _counts(cluster)
    assert after_fetches == fetches  # no HTTP fetch: the watermark reached b2 and b3 by push
    assert after_pushes - pushes >= 2 * 150  # records and watermarks, to each of two followers
    frames = cluster["b1"].frames(TOPIC)
    assert len(frames) == 151
    assert cluster["b2"].frames(TOPIC) == frames  # the same records at the same offsets, byte for byte
    assert cluster["b3"].frames(TOPIC) == frames


def test_a_replica_whose_peer_link_drops_fetches_over_http_and_loses_nothing(make_cluster):
    cluster = make_cluster()
    cluster.start_replication([_all_in_sync()])
    subscriber = PahoClient(cluster["b2"].port, "watcher-fallback")
    subscriber.subscribe(TOPIC, qos=1)
    device = PahoClient(cluster["b1"].port, "device-fallback")
    sent = [f"before {n}".encode() for n in range(20)]
    for payload in sent[:10]:
        device.publish(TOPIC, payload, qos=1)
    assert wait_for(lambda: _pushed(cluster, "b2"))
    fetches, _pushes = _counts(cluster)
    cluster.run(cluster["b2"].stop_links())  # b2's links close for good: it can only fetch now
    assert wait_for(lambda: not _pushed(cluster, "b2"))
    for payload in sent[10:]:
        device.publish(TOPIC, payload, qos=1)  # acknowledged: b2 fetched it over HTTP
    assert cluster["b2"].durable_end(TOPIC) == 20
    assert _counts(cluster)[0] > fetches
    assert [m.payload for m in subscriber.expect(20)] == sent
    assert wait_for(lambda: cluster["b2"].committed_end(TOPIC) == 20)
    assert cluster["b2"].frames(TOPIC) == cluster["b1"].frames(TOPIC)
    assert _pushed(cluster, "b3")  # the other follower is still pushed
    assert set(cluster.state().isr) == set(NODES)


def _topic_in(partition: int, partitions: int) -> str:
    return next(
        topic
        for number in range(100)
        if partition_of(topic := f"site/device-{number}/power", partitions) == partition
    )


def test_each_leader_replicates_its_own_partitions_to_the_others(make_cluster):
    cluster = make_cluster(partitions=2)
    topics = [_topic_in(0, 2), _topic_in(1, 2)]
    cluster.start_replication(
        [PartitionState(0, "b1", 1, NODES, NODES), PartitionState(1, "b2", 4, NODES, NODES)]
    )
    subscriber = PahoClient(cluster["b3"].port, "watcher-4")
    subscriber.subscribe("site/+/power", qos=1)
    devices = [PahoClient(cluster["b1"].port, "device-10"), PahoClient(cluster["b2"].port, "device-11")]
    for number in range(10):
        for device, topic in zip(devices, topics, strict=True):
            device.publish(topic, f"{topic} {number}".encode(), qos=1)
    received = subscriber.expect(20)
    for topic in topics:
        assert [m.payload for m in received if m.topic == topic] == [
            f"{topic} {n}".encode() for n in range(10)
        ]
        for node in NODES:
            assert cluster[node].durable_end(topic) == 10
        assert cluster["b3"].frames(topic) == cluster["b1"].frames(topic)
        assert cluster["b2"].frames(topic) == cluster["b1"].frames(topic)


def test_a_new_leader_delivers_the_records_it_held_as_a_follower_once_they_are_committed(make_cluster):
    cluster = make_cluster()
    cluster.start_replication([_all_in_sync()])
    cluster.run(cluster["b3"].stop_followers())
    subscriber = PahoClient(cluster["b2"].port, "watcher-5")
    subscriber.subscribe(TOPIC, qos=1)
    publisher = AckWatcher(cluster["b1"].port, "device-12")
    publisher.publish(b"held by b1 and b2")
    assert wait_for(lambda: cluster["b2"].durable_end(TOPIC) == 1)
    subscriber.expect_none(timeout=0.3)  # not committed yet
    cluster.set_state(PartitionState(0, "b2", 2, NODES, ("b2", "b3")))  # b1 is gone
    cluster.call(cluster["b3"].start_followers)
    assert subscriber.expect(1)[0].payload == b"held by b1 and b2"
    assert wait_for(lambda: cluster["b3"].committed_end(TOPIC) == 1)
    subscriber.expect_none(timeout=0.3)  # once


def test_a_fenced_leader_refuses_what_it_has_not_acknowledged(make_cluster):
    cluster = make_cluster()
    cluster.start_replication([_all_in_sync()])
    cluster.run(cluster["b3"].stop_followers())
    publisher = AckWatcher(cluster["b1"].port, "device-13")
    publisher.publish(b"pending")
    assert publisher.ack(timeout=0.5) is None

    def fence() -> None:
        view = cluster["b1"].view
        view.fenced = True
        view.changed()

    cluster.call(fence)
    mid, reason = publisher.ack(timeout=5) or (None, 0)
    assert mid is not None and reason >= 0x80


def test_the_fetch_endpoint_serves_members_as_themselves_and_wants_a_well_formed_body(make_cluster):
    cluster = make_cluster()
    cluster.start_replication([_all_in_sync()])
    leader = cluster["b1"].member
    many = FetchRequest(
        "b2",
        0,
        False,
        0,
        1 << 20,
        1 << 20,
        [PartitionFetch(0, 1, [TopicPosition(f"d/{n:06d}/x" * 3, 0, -1) for n in range(40_000)])],
    )

    async def as_reader(body: bytes) -> int:
        headers = {"Authorization": "Bearer reader-token"}
        url = leader.offsets_api + PATH
        async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as answer:
            return answer.status

    async def as_member(node: str, body: bytes) -> tuple[int, bytes]:
        session = cluster[node].clients.session("b1")
        async with session.post(str(leader.peer) + PATH, data=body) as answer:
            return answer.status, await answer.read()

    assert cluster.run(as_reader(encode_request(many))) == 404  # a reader's API has no member endpoint
    status, body = cluster.run(as_member("b2", b"\x01\x00"))
    assert status == 400 and b"replica" in body
    large = encode_request(many)
    assert len(large) > 1 << 20  # a first fetch of a follower holding many device topics
    status, body = cluster.run(as_member("b2", large))
    assert status == 200
    assert decode_response(body).partitions[0].error == OK
    status, body = cluster.run(as_member("b3", large))  # b3 fetching as b2: a member acts only as itself
    assert status == 403 and b"b3 fetches as b2" in body


def test_a_replica_broker_restarted_on_its_directory_catches_up_and_rejoins(make_cluster):
    cluster = make_cluster(leader_config=LeaderConfig(min_insync_replicas=2, replica_lag_max_ms=600))
    cluster.start_replication([_all_in_sync()])
    device = PahoClient(cluster["b1"].port, "device-14")
    for number in range(10):
        device.publish(TOPIC, f"first {number}".encode(), qos=1)
    cluster.stop_node("b3")
    assert wait_for(lambda: cluster.state().isr == ("b1", "b2"), timeout=5)
    for number in range(30):
        device.publish(TOPIC, f"second {number}".encode(), qos=1)
    restarted = cluster.restart_node("b3")
    assert wait_for(lambda: set(cluster.state().isr) == set(NODES), timeout=10)
    assert restarted.durable_end(TOPIC) == 40
    assert restarted.frames(TOPIC) == cluster["b1"].frames(TOPIC)
    subscriber = PahoClient(restarted.port, "watcher-6")  # once caught up: a replica catching up
    subscriber.subscribe(TOPIC, qos=1)  # delivers what it receives, late but in order and once
    device.publish(TOPIC, b"after the restart", qos=1)
    assert [m.payload for m in subscriber.expect(1)] == [b"after the restart"]
    assert wait_for(lambda: restarted.payloads(TOPIC)[-1] == (40, b"after the restart"))


@pytest.mark.parametrize("seen", ["apart", "in one batch"])
def test_a_member_back_after_its_lease_ended_rejoins_the_in_sync_set_only_on_a_session_of_its_own(
    make_cluster, seen
):
    """A leader keeps a follower's fetch session after the follower's process is gone; the member's lease
    ending takes it out of the members and of the partition's in-sync set (the controller), and it may come
    back within ``replica_lag_max_ms``. The session of its former process, caught up when it died, must not
    bring it back into the in-sync set before it has shown its log in a session of its own (it may have come
    back without its records, or with a log it cannot prove, and a member in the in-sync set can be made
    leader). The leader may see the lease's end and the new registration apart, or in one batch of changes
    (then the member never looks absent: only its registration tells the processes apart), and may check
    its in-sync sets before its view's listeners have run."""
    cluster = make_cluster()  # replica_lag_max_ms 10 s: the former session still counts as in contact
    cluster.start_replication([_all_in_sync()])
    device = PahoClient(cluster["b1"].port, "device-back")
    for number in range(5):
        device.publish(TOPIC, f"before {number}".encode(), qos=1)
    member = cluster.call(lambda: cluster.isr.views[0].members["b3"])
    cluster.stop_node("b3")
    left = PartitionState(0, "b1", 1, ("b1", "b2"), ("b1", "b2"))  # its lease ended: out of the partition
    back = PartitionState(0, "b1", 1, NODES, ("b1", "b2"))  # given its copy back, not yet in sync

    def leave() -> None:
        for view in cluster.isr.views:
            del view.members["b3"]
            view.registrations.pop("b3", None)
        cluster.isr.set(left)

    def come_back() -> None:  # registered again and given its copy back, before its first fetch
        leader = cluster["b1"].leader
        assert leader is not None
        for view in cluster.isr.views:
            view.members["b3"] = member
            view.registrations["b3"] = 2
            view.states[0] = back
        leader.check_isr()  # before the views' listeners have run
        for view in cluster.isr.views:
            view.changed()
        leader.check_isr()

    if seen == "apart":
        cluster.call(leave)
    cluster.call(come_back)
    time.sleep(0.5)  # the leader's own checks run meanwhile, and any change it asked for is applied
    assert ("expand", 0, "b3") not in cluster.isr.changes
    assert cluster.state().isr == ("b1", "b2")

    restarted = cluster.restart_node("b3")  # its own session shows its log: caught up, it rejoins
    assert wait_for(lambda: set(cluster.state().isr) == set(NODES), timeout=10)
    assert restarted.frames(TOPIC) == cluster["b1"].frames(TOPIC)


@pytest.mark.parametrize("peer_links", [True, False], ids=["pushed", "fetched"])
def test_a_live_followers_session_ended_by_a_registration_learnt_late_is_opened_again(
    make_cluster, peer_links
):
    """A follower may open its session before its leader has seen its member's registration (its record on
    the leader's watch, behind its first fetch): the session is ended at the view change that shows it,
    and the follower opens another and replicates on, nothing acknowledged late or lost."""
    cluster = make_cluster(peer_links=peer_links)
    cluster.start_replication([_all_in_sync()])
    device = PahoClient(cluster["b1"].port, "device-late")
    for number in range(5):
        device.publish(TOPIC, f"before {number}".encode(), qos=1)
    leader = cluster["b1"].leader
    assert leader is not None
    opened = cluster.call(lambda: leader.fetches.sessions[("b2", False)])

    def learnt() -> None:
        for view in cluster.isr.views:
            view.registrations["b2"] = 7
        for view in cluster.isr.views:
            view.changed()

    cluster.call(learnt)
    assert cluster.call(lambda: leader.fetches.sessions.get(("b2", False))) is not opened
    publisher = AckWatcher(cluster["b1"].port, "device-late-2")
    for number in range(5):
        publisher.publish(f"after {number}".encode())
        mid, reason = publisher.ack(timeout=5.0) or (None, None)
        assert mid is not None and reason is not None and reason < 0x80
    assert cluster["b2"].durable_end(TOPIC) == 10
    assert cluster["b2"].frames(TOPIC) == cluster["b1"].frames(TOPIC)
    session = cluster.call(lambda: leader.fetches.sessions[("b2", False)])
    assert session is not opened and session.registration == 7
    assert cluster.state().isr == NODES


def test_a_restarted_replica_shows_its_readers_no_record_that_was_not_committed(make_cluster):
    cluster = make_cluster()
    cluster.start_replication([_all_in_sync()])
    PahoClient(cluster["b1"].port, "device-hw").publish(TOPIC, b"committed", qos=1)
    assert wait_for(lambda: cluster["b2"].committed_end(TOPIC) == 1)
    cluster.run(cluster["b3"].stop_followers())  # b3 stays in the in-sync set: nothing more commits
    publisher = AckWatcher(cluster["b1"].port, "device-hw-2")
    publisher.publish(b"not committed")
    assert wait_for(lambda: cluster["b2"].durable_end(TOPIC) == 2)
    cluster.stop_node("b2")
    restarted = cluster.restart_node("b2")
    assert restarted.durable_end(TOPIC) == 2
    assert restarted.payloads(TOPIC) == [(0, b"committed")]  # its saved watermark, not its log's end
    cluster.call(cluster["b3"].start_followers)
    assert publisher.ack(timeout=5) is not None
    expected = [(0, b"committed"), (1, b"not committed")]
    assert wait_for(lambda: cluster["b2"].payloads(TOPIC) == expected)  # learnt from the leader


def test_a_new_replica_of_a_log_retention_shortened_starts_where_the_leader_starts(make_cluster):
    cluster = make_cluster(storage={"segment_bytes": 4096, "retention_bytes": 8192})
    cluster.start_replication([PartitionState(0, "b1", 1, NODES, ("b1", "b2"))])
    cluster.run(cluster["b3"].stop_followers())
    device = PahoClient(cluster["b1"].port, "device-15")
    for number in range(100):
        device.publish(TOPIC, f"kept or not {number:03d}".encode() * 4, qos=1)
    leader_store = cluster["b1"].store
    cluster.call(leader_store.apply_retention)
    start = cluster.call(lambda: leader_store.log_info(TOPIC).start_offset)
    assert start > 0
    cluster.call(cluster["b3"].start_followers)
    assert wait_for(lambda: cluster["b3"].durable_end(TOPIC) == 100, timeout=10)
    assert cluster.call(lambda: cluster["b3"].store.log_info(TOPIC).start_offset) == start
    assert cluster["b3"].frames(TOPIC) == cluster["b1"].frames(TOPIC)
    assert wait_for(lambda: set(cluster.state().isr) == set(NODES), timeout=10)


def test_a_former_leader_restarted_reads_its_epochs_from_disk_and_truncates_what_was_never_acknowledged(
    make_cluster,
):
    cluster = make_cluster()
    device, stranded = _strand_on_leader(cluster, acknowledged=4, stranded=6, first_device=16)
    device.kill()
    stranded.client.kill()
    cluster.stop_node("b1")  # the leader goes away holding six records nobody else has
    cluster.set_state(PartitionState(0, "b2", 2, NODES, ("b2", "b3")))
    for node in ("b2", "b3"):
        cluster.call(cluster[node].start_followers)
    new_device = PahoClient(cluster["b2"].port, "device-18")
    for number in range(3):
        new_device.publish(TOPIC, f"epoch two {number}".encode(), qos=1)
    restarted = cluster.restart_node("b1")
    expected = [(n, f"acknowledged {n}".encode()) for n in range(4)]
    expected += [(4 + n, f"epoch two {n}".encode()) for n in range(3)]
    assert wait_for(
        lambda: restarted.durable_end(TOPIC) == 7 and restarted.payloads(TOPIC) == expected, timeout=10
    )
    assert restarted.frames(TOPIC) == cluster["b2"].frames(TOPIC)
    epochs = cluster.call(lambda: restarted.followers.epochs.for_topic(TOPIC).entries)
    assert epochs == [(1, 0), (2, 4)]


def _strand_on_leader(
    cluster: InProcessCluster, acknowledged: int, stranded: int, first_device: int
) -> tuple[PahoClient, AckWatcher]:
    """b1 leads with everyone in sync and gets ``acknowledged`` records acknowledged; then b2 and b3 stop
    fetching and b1 appends ``stranded`` more that nobody else holds, so none of them is acknowledged."""
    cluster.start_replication([_all_in_sync()])
    device = PahoClient(cluster["b1"].port, f"device-{first_device}")
    for number in range(acknowledged):
        device.publish(TOPIC, f"acknowledged {number}".encode(), qos=1)
    for node in ("b2", "b3"):
        cluster.run(cluster[node].stop_followers())
    watcher = AckWatcher(cluster["b1"].port, f"device-{first_device + 1}")
    for number in range(stranded):
        watcher.publish(f"never acknowledged {number}".encode())
    assert wait_for(lambda: cluster["b1"].durable_end(TOPIC) == acknowledged + stranded)
    return device, watcher


def _lose_tail(directory: Path, topic: str, end: int) -> None:
    """Cut a stopped broker's log of `topic` at `end`, as a lost disk tail would."""
    store = LogStore(directory)
    store.open()
    try:
        store.replicated_log.truncate_to(topic, end)
    finally:
        store.close()


def test_records_a_follower_holds_beyond_the_new_leaders_log_are_cut_and_nothing_acknowledged_is_lost(
    make_cluster,
):
    cluster = make_cluster()
    cluster.start_replication([_all_in_sync()])
    device = PahoClient(cluster["b1"].port, "device-30")
    for number in range(4):
        device.publish(TOPIC, f"acknowledged {number}".encode(), qos=1)
    cluster.run(cluster["b3"].stop_followers())
    stranded = AckWatcher(cluster["b1"].port, "device-31")
    for number in range(3):
        stranded.publish(f"never acknowledged {number}".encode())
    assert wait_for(lambda: cluster["b2"].durable_end(TOPIC) == 7)  # b2 copied them
    assert stranded.ack(timeout=0.5) is None  # b3 has not: never acknowledged
    device.kill()
    stranded.client.kill()
    cluster.stop_node("b1")
    _lose_tail(cluster["b1"].directory, TOPIC, 4)  # b1 comes back without them
    cluster.set_state(PartitionState(0, "b3", 2, NODES, ("b2", "b3")))
    cluster.call(cluster["b3"].start_followers)
    new_device = PahoClient(cluster["b3"].port, "device-32")
    for number in range(2):
        new_device.publish(TOPIC, f"epoch two {number}".encode(), qos=1)
    expected = [(n, f"acknowledged {n}".encode()) for n in range(4)]
    expected += [(4 + n, f"epoch two {n}".encode()) for n in range(2)]
    assert wait_for(lambda: cluster["b2"].payloads(TOPIC) == expected, timeout=10)
    restarted = cluster.restart_node("b1")
    assert wait_for(lambda: restarted.payloads(TOPIC) == expected, timeout=10)
    reference = cluster["b3"].frames(TOPIC)
    assert cluster["b2"].frames(TOPIC) == reference
    assert wait_for(lambda: restarted.frames(TOPIC) == reference, timeout=10)


def test_leadership_moving_back_and_forth_under_load_loses_no_acknowledged_record(make_cluster):
    cluster = make_cluster(follower_config=FollowerConfig(wait_ms=100))
    cluster.start_replication([_all_in_sync()])
    publishers = {node: AckWatcher(cluster[node].port, f"mover-{node}") for node in ("b1", "b2")}
    acknowledged: list[bytes] = []
    for number in range(150):
        if number % 25 == 24:  # the controller moves leadership to the other in-sync broker
            state = cluster.state()
            other = "b2" if state.leader == "b1" else "b1"
            if other in state.isr:
                cluster.set_state(PartitionState(0, other, state.epoch + 1, NODES, state.isr))
        payload = f"moving {number}".encode()
        for _attempt in range(20):
            publisher = publishers[cluster.state().leader or "b1"]
            mid = publisher.publish(payload)
            ack = publisher.ack(timeout=5)
            while ack is not None and ack[0] != mid:  # a late answer to an earlier attempt
                ack = publisher.ack(timeout=5)
            if ack is not None and ack[1] < 0x80:
                acknowledged.append(payload)
                break
        else:
            raise AssertionError(f"{payload!r} was never acknowledged")
    assert cluster.state().epoch > 3
    leader = cluster[cluster.state().leader or "b1"]
    final = leader.durable_end(TOPIC)
    assert wait_for(lambda: all(cluster[n].committed_end(TOPIC) == final for n in NODES), timeout=10)
    stored = [payload for _offset, payload in leader.payloads(TOPIC)]
    assert set(acknowledged) <= set(
        stored
    )  # refused attempts may be in the log too, never acknowledged ones lost
    first_seen = list(dict.fromkeys(p for p in stored if p in set(acknowledged)))
    assert first_seen == acknowledged  # in the order they were published
    for node in NODES:
        assert cluster[node].frames(TOPIC) == leader.frames(TOPIC)
