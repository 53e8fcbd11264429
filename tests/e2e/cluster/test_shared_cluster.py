"""Shared subscriptions across a cluster: three broker processes and a real etcd serve one group.

A ``$share/<group>/<filter>`` group with a member on each broker gets every message published on any broker
exactly once in total (QoS 0, 1 and 2; MQTT 5 and 3.1.1 members), never also through a broker's ordinary
routing. When a member's broker dies, the messages it held unacknowledged reach the members on the other
brokers: every publish acknowledged to its publisher reaches a live member at least once.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import time
from collections import Counter
from collections.abc import Callable

import pytest

from broker_edge.protocol.packets import PubComp, Publish, PubRec, PubRel
from broker_edge.protocol.properties import Properties
from tests.e2e.broker_clients import PahoClient, RawClient
from tests.e2e.cluster.proof import Device, cluster_state, metric, wait_until

GROUP = "$share/workers/jobs/#"
WARM = b"warm"


class Members:
    """Members of one group, one per broker, and every payload each has received."""

    def __init__(self, clients: dict[str, PahoClient | RawClient]) -> None:
        self.clients = clients
        self.got: dict[str, list[tuple[bytes, int]]] = {node: [] for node in clients}

    def collect(self) -> None:
        for node, client in self.clients.items():
            if isinstance(client, RawClient):  # receives, never acknowledges
                with contextlib.suppress(TimeoutError):
                    while True:
                        packet = client.recv(0.05)
                        if isinstance(packet, Publish):
                            self.got[node].append((packet.payload, packet.qos))
            else:
                with contextlib.suppress(queue.Empty):
                    while True:
                        message = client.messages.get_nowait()
                        self.got[node].append((message.payload, message.qos))

    def payloads(self, nodes: str) -> Counter[bytes]:
        """How often each payload (warm-ups left out) reached the members on ``nodes``."""
        return Counter(
            payload for node in nodes for payload, _ in self.got[node] if not payload.startswith(WARM)
        )

    def warm_up(self, publish: Callable[[bytes], None]) -> None:
        """Publish until every member has had a message: each broker's membership is known to the others."""
        count = itertools.count()

        def everyone_served() -> bool:
            publish(WARM + str(next(count)).encode())
            self.collect()
            return all(any(p.startswith(WARM) for p, _ in got) for got in self.got.values())

        wait_until(everyone_served, 30, "every member served once", lambda: self.got)


def drained(client: PahoClient, into: list[bytes]) -> list[bytes]:
    """``into`` with the payloads ``client`` has received since added (none waited for)."""
    with contextlib.suppress(queue.Empty):
        while True:
            into.append(client.messages.get_nowait().payload)
    return into


def wait_all(members: Members, expected: set[bytes], nodes: str, what: str) -> None:
    def arrived() -> bool:
        members.collect()
        return set(members.payloads(nodes)) >= expected

    wait_until(arrived, 40, what, lambda: sorted(expected - set(members.payloads(nodes)))[:10])


@pytest.mark.mqtt5("MQTT-4.8.2-3")
@pytest.mark.parametrize("version", [5, 4], ids=["v5", "v3.1.1"])
def test_each_message_reaches_exactly_one_member_of_the_group_across_brokers(three_brokers, version):
    members = Members(
        {
            node: PahoClient(broker.port, f"worker-{node}-{version}", version=version)
            for node, broker in three_brokers.items()
        }
    )
    for client in members.clients.values():
        assert isinstance(client, PahoClient)
        client.subscribe(GROUP, 1)  # granted QoS 1: QoS 2 publishes are delivered at QoS 1
    publishers = [
        PahoClient(broker.port, f"boss-{node}-{version}", version=version)
        for node, broker in three_brokers.items()
    ]
    members.warm_up(lambda payload: publishers[0].publish("jobs/warm", payload, 1))

    per_qos = 30
    sent: dict[bytes, int] = {}
    for qos in (0, 1, 2):
        for n in range(per_qos):
            payload = f"{qos}:{n}".encode()
            publishers[n % 3].publish(f"jobs/{qos}/{n}", payload, qos)  # topics of every partition
            sent[payload] = qos

    wait_all(members, set(sent), "abc", "every message at some member")
    time.sleep(1.0)  # a second copy of any of them would have arrived by now
    members.collect()
    counts = members.payloads("abc")
    assert set(counts) == set(sent)
    assert [payload for payload, n in counts.items() if n != 1] == []  # exactly once cluster-wide
    for node in "abc":
        assert members.payloads(node), f"the member on {node} got nothing"  # members on every broker
        for payload, qos in members.got[node]:
            if not payload.startswith(WARM):
                assert qos == min(sent[payload], 1)  # the granted QoS caps the delivery


def test_the_unacknowledged_messages_of_a_dead_members_broker_reach_the_other_members(three_brokers):
    """Members on a and b acknowledge; the member on c receives and never acknowledges. Publishers on a
    and b publish QoS 1 on topics of every partition (some led by c); then c is killed. Every message the
    publishers had acknowledged reaches the members on a or b: those c held unacknowledged once more, the
    others exactly once."""
    a, b, c = (three_brokers[node] for node in "abc")
    silent = RawClient(c.port)
    silent.connect("silent-worker")
    silent.subscribe(GROUP, 1)
    members = Members(
        {
            "a": PahoClient(a.port, "worker-a"),
            "b": PahoClient(b.port, "worker-b"),
            "c": silent,
        }
    )
    for node in "ab":
        client = members.clients[node]
        assert isinstance(client, PahoClient)
        client.subscribe(GROUP, 1)
    publishers = [PahoClient(a.port, "boss-a"), PahoClient(b.port, "boss-b")]
    members.warm_up(lambda payload: publishers[0].publish("jobs/warm", payload, 1))

    acknowledged = set()
    for n in range(60):
        payload = f"job-{n}".encode()
        publishers[n % 2].publish(f"jobs/{n}", payload, 1)  # returns once PUBACKed
        acknowledged.add(payload)
    wait_all(members, acknowledged, "abc", "every job at some member before the kill")
    before = members.payloads("abc")
    assert [payload for payload, n in before.items() if n != 1] == []  # exactly once while all live
    held_by_c = set(members.payloads("c"))
    assert held_by_c, "the member on c got no job: nothing to move"

    c.kill()
    del members.clients["c"]  # its connection is gone with its broker (what it received stays counted)
    wait_all(members, acknowledged, "ab", "every acknowledged job at a member on a or b after c died")
    time.sleep(1.0)  # anything moved twice would have arrived by now
    members.collect()
    survivors = members.payloads("ab")
    assert [payload for payload, n in survivors.items() if n != 1] == []  # moved once, the others untouched


def test_a_broker_that_restarts_and_takes_back_its_leaderships_delivers_nothing_twice(three_brokers, etcd):
    """Devices publish QoS 1 through a and b on topics of every partition while c (a member's broker) is
    stopped and started again, and leadership moves back to it partition by partition. Every acknowledged
    publish reaches a member; those published after c's return, while leaderships move, exactly once."""
    a, b, c = (three_brokers[node] for node in "abc")
    clients: dict[str, PahoClient | RawClient] = {
        node: PahoClient(broker.port, f"worker-{node}") for node, broker in three_brokers.items()
    }
    members = Members(clients)
    for client in clients.values():
        assert isinstance(client, PahoClient)
        client.subscribe(GROUP, 1)
    publisher = PahoClient(a.port, "boss")
    members.warm_up(lambda payload: publisher.publish("jobs/warm", payload, 1))
    devices = [Device(f"dev-{n}", f"jobs/dev-{n}", [a, b], start_at=n) for n in range(6)]
    for device in devices:
        device.start()

    c.stop()
    wait_until(lambda: "c" not in cluster_state(etcd).leaders(), 30, "c's partitions led by a and b")
    c.start()
    returned = PahoClient(c.port, "worker-c-again")
    returned.subscribe(GROUP, 1)
    members.collect()  # what c's first member received and acknowledged before c stopped counts
    members.clients["c"] = returned
    back_at = time.monotonic()
    wait_until(lambda: cluster_state(etcd).leaders().get("c", 0) >= 4, 60, "c leading its share again")
    time.sleep(1.0)  # publishing on under the new leaders
    for device in devices:
        device.stop()

    acknowledged = {payload for device in devices for payload in device.acked}
    wait_all(members, acknowledged, "abc", "every acknowledged publish at some member")
    since_back = {
        payload
        for device in devices
        for payload, at in zip(device.acked, device.ack_times, strict=True)
        if at > back_at
    }
    assert since_back, "nothing published while leadership moved back"
    counts = members.payloads("abc")
    assert [payload for payload in since_back if counts[payload] != 1] == []
    assert any(payload in since_back for payload, _ in members.got["c"]), "c's new member got nothing"


def test_a_qos1_job_of_a_member_whose_session_ends_goes_to_a_member_on_another_broker(three_brokers):
    """MQTT 5.0 4.8.2: a QoS 1 message a member's ended session held unacknowledged SHOULD go to another
    member: with none left on its broker, the leader of its partition gives it to a broker with members."""
    a, c = three_brokers["a"], three_brokers["c"]
    leaving = RawClient(c.port)
    leaving.connect("leaving-worker")  # Session Expiry 0: the session ends with the connection
    leaving.subscribe(GROUP, 1)
    members = Members({"c": leaving})
    publisher = PahoClient(a.port, "boss")
    members.warm_up(lambda payload: publisher.publish("jobs/warm", payload, 1))
    publisher.publish("jobs/once", b"for the leaving member", 1)
    wait_all(members, {b"for the leaving member"}, "c", "the job at the member on c")

    other = PahoClient(a.port, "staying-worker")
    other.subscribe(GROUP, 1)
    received: list[bytes] = []

    def served() -> bool:
        publisher.publish("jobs/next", b"next", 1)
        return b"next" in drained(other, received)

    wait_until(served, 20, "the member on a served")
    leaving.close()  # unacknowledged

    def moved() -> bool:
        return b"for the leaving member" in drained(other, received)

    wait_until(moved, 20, "the leaving member's job at the member on a")
    assert received.count(b"for the leaving member") == 1


def too_large_drops(brokers: dict) -> int:
    """Messages the brokers dropped as larger than a subscriber's Maximum Packet Size, all together."""
    total = 0
    for broker in brokers.values():
        with contextlib.suppress(AssertionError):  # none counted yet on that broker
            total += int(metric(broker, "timestone_broker_messages_dropped_total", reason="too_large"))
    return total


@pytest.mark.mqtt5("MQTT-3.1.2-24", "MQTT-3.1.2-25")
@pytest.mark.parametrize("qos", [1, 0], ids=["logged", "unlogged"])
def test_a_message_too_large_for_a_brokers_members_goes_to_a_member_on_another_broker(three_brokers, qos):
    """A message larger than the Maximum Packet Size of every member of the group on the broker it was given
    to is never sent to them [MQTT-3.1.2-24]: a logged one that broker declines and the leader gives to a
    broker whose member can take it; an unlogged (QoS 0) one that broker hands to such a broker itself,
    whether it was published there (a) or elsewhere (c). It is dropped, counted ``too_large`` once
    [MQTT-3.1.2-25], only when no member anywhere can."""
    small = RawClient(three_brokers["a"].port, 5)
    small.connect("small", properties=Properties(maximum_packet_size=64))
    small.subscribe(GROUP, 1)
    large = PahoClient(three_brokers["b"].port, "large")
    large.subscribe(GROUP, 1)
    members = Members({"a": small, "b": large})
    publishers = [PahoClient(three_brokers[node].port, f"boss-{node}") for node in "ca"]
    members.warm_up(lambda payload: publishers[0].publish("jobs/warm", payload, 1))

    sent = {str(n).encode() * 100 for n in range(12)}
    for n, payload in enumerate(sorted(sent)):
        publishers[n % 2].publish(f"jobs/{n}", payload, qos)  # topics of every partition
    wait_all(members, sent, "b", "every large message at the member that can take it")
    assert members.payloads("a") == Counter()
    assert too_large_drops(three_brokers) == 0

    large.unsubscribe(GROUP)
    publishers[0].publish("jobs/last", b"x" * 100, qos)
    wait_until(lambda: too_large_drops(three_brokers) == 1, 40, "the last one dropped as too large")
    members.collect()
    assert members.payloads("a") == Counter()


@pytest.mark.mqtt5("MQTT-4.8.2-4", "MQTT-4.8.2-5")
def test_a_qos2_job_in_flight_to_a_member_that_resumes_on_another_broker_is_completed_there(three_brokers):
    """MQTT 5.0 4.8.2: a QoS 2 message sent to a member that had not answered PUBREC when its connection
    broke is completed to that member when it reconnects [MQTT-4.8.2-4], and sent to no other member
    [MQTT-4.8.2-5]: also when it resumes its session on another broker, which sends it again with its
    packet id and DUP."""
    a, b, c = (three_brokers[node] for node in "abc")
    persistent = Properties(session_expiry_interval=300)
    moving = RawClient(a.port)
    moving.connect("moving-worker", properties=persistent)
    moving.subscribe(GROUP, 2)
    other = PahoClient(c.port, "other-worker")
    other.subscribe(GROUP, 2)
    publisher = PahoClient(b.port, "boss")
    held: list[Publish] = []
    count = itertools.count()

    def moving_holds_a_job() -> bool:
        number = next(count)
        publisher.publish(f"jobs/{number}", f"job {number}".encode(), 2)
        with contextlib.suppress(TimeoutError):
            while True:
                packet = moving.recv(0.05)
                if isinstance(packet, Publish):
                    held.append(packet)  # never answered with PUBREC
        return bool(held)

    wait_until(moving_holds_a_job, 30, "a job in flight to the member on a")
    moving.close()
    back = RawClient(b.port)
    assert back.connect("moving-worker", clean_start=False, properties=persistent).session_present
    for job in held:
        again = back.recv()
        assert isinstance(again, Publish), again
        packet_id = job.packet_id
        assert packet_id is not None
        assert (again.payload, again.packet_id, again.qos, again.dup) == (job.payload, packet_id, 2, True)
        back.send_packet(PubRec(packet_id))
        assert back.recv() == PubRel(packet_id)
        back.send_packet(PubComp(packet_id))

    later: list[bytes] = []

    def other_served_after() -> bool:
        publisher.publish("jobs/after", b"after", 2)
        return b"after" in drained(other, later)

    wait_until(other_served_after, 30, "a later job at the member on c")
    assert not {job.payload for job in held} & set(later)  # no other member got one of them
