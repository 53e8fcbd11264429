"""A follower routes only what its subscribers can match: three broker processes, a real etcd, paho clients.

Every partition has three replicas. A follower passes over the committed records of a topic no subscription
on it matches (``timestone_broker_followed_records_total{outcome="passed_over"}``: not decoded) and routes
the others: those a subscriber of its own wants, one offline or a shared group's member included, and every
retained one (each broker keeps the whole retained set). A shared group's records are assigned by their
leader: a follower with no member of the group passes them over. A subscription made after records were
passed over gets what MQTT promises (the retained message, every message published from then on) and,
replaying, every record from the log.
"""

from __future__ import annotations

import pytest

from broker_edge.placement import partition_of
from broker_edge.runtime.launcher import BrokerProcess
from tests.e2e.broker_clients import PahoClient
from tests.e2e.cluster.proof import EtcdTarget, cluster_state, metric, wait_until

COUNT = 20


def followed(broker: BrokerProcess, outcome: str) -> float:
    """The broker's ``followed_records`` counter for ``outcome`` (routed, passed_over), read from /metrics."""
    return metric(broker, "timestone_broker_followed_records_total", outcome=outcome)


def led_by(target: EtcdTarget, leader: str, prefix: str, only_ever: bool = False) -> str:
    """A topic under ``prefix`` whose partition ``leader`` leads; ``only_ever``: and has led since the
    partition was made (its first epoch), so that no other member ever led it."""
    state = cluster_state(target)
    partitions = len(state.partitions)
    found = next(
        (
            topic
            for topic in (f"{prefix}/{n}" for n in range(1000))
            if (partition := state.partitions[partition_of(topic, partitions)]).leader == leader
            and (partition.epoch == 0 or not only_ever)
        ),
        None,
    )
    since = " since it was made" if only_ever else ""
    assert found is not None, f"no partition {leader} leads{since}: {state}"
    return found


@pytest.mark.mqtt311("MQTT-3.3.1-6")
def test_a_follower_passes_over_what_no_subscriber_of_its_own_wants_and_loses_nothing(
    three_brokers: dict[str, BrokerProcess], etcd: EtcdTarget
) -> None:
    a, b, c = three_brokers["a"], three_brokers["b"], three_brokers["c"]
    watched = led_by(etcd, "a", "routing/watched")
    unwatched = led_by(etcd, "a", "routing/unwatched")
    status = led_by(etcd, "a", "routing/status")
    asleep = led_by(etcd, "a", "routing/asleep")
    # a member that led a partition since it started may assign the records of its epochs to a shared
    # group's members, so it routes the partition's group records (assigning none of a's): c must never have
    # led the jobs' partition (members that start together may each lead a partition first)
    jobs = led_by(etcd, "a", "routing/jobs", only_ever=True)
    watcher = PahoClient(b.port, "watcher", version=4)
    assert watcher.subscribe(watched, 1) == [1]
    sleeper = PahoClient(c.port, "sleeper", version=4, clean=False)
    assert sleeper.subscribe(asleep, 1) == [1]
    sleeper.disconnect()  # offline: its subscription still wants the topic's records on c
    worker = PahoClient(b.port, "worker")
    assert worker.subscribe(f"$share/workers/{jobs}", 1) == [1]  # a's records, assigned by a, served on b
    before = {
        (broker, outcome): followed(broker, outcome)
        for broker in (b, c)
        for outcome in ("routed", "passed_over")
    }

    publisher = PahoClient(a.port, "publisher", version=4)
    warm_ups = 0

    def worker_served() -> bool:  # once a knows of b's group member (through etcd), it assigns to it
        nonlocal warm_ups
        warm_ups += 1
        publisher.publish(jobs, b"warm-up", 1)
        return not worker.messages.empty()

    wait_until(worker_served, 30, "the shared group's member on b served")
    worker.expect(1)
    for n in range(COUNT):
        publisher.publish(watched, f"w{n}".encode(), 1)
        publisher.publish(unwatched, f"u{n}".encode(), 1)
    publisher.publish(status, b"on", 1, retain=True)
    for n in range(3):
        publisher.publish(asleep, f"s{n}".encode(), 1)
        publisher.publish(jobs, f"j{n}".encode(), 1)

    # b, a follower with a subscriber, delivers every message of its topic, in order
    assert [m.payload for m in watcher.expect(COUNT, timeout=15)] == [f"w{n}".encode() for n in range(COUNT)]
    jobs_got: list[bytes] = []
    while len(jobs_got) < 3:  # after the last warm-ups, in order
        payload = worker.expect(1, timeout=15)[0].payload
        if payload != b"warm-up":
            jobs_got.append(payload)
    assert jobs_got == [b"j0", b"j1", b"j2"]

    def delta(broker: BrokerProcess, outcome: str) -> float:
        return followed(broker, outcome) - before[(broker, outcome)]

    # c (nobody on it wants the watched, unwatched or jobs topic; a, not c, assigns the jobs to the shared
    # group's members) decoded none of their records: only the retained one and the offline subscriber's;
    # b passed over the unwatched topic and the sleeper's, and routed the rest
    jobs_records = warm_ups + 3
    wait_until(lambda: delta(c, "passed_over") >= 2 * COUNT + jobs_records, 15, "c passing over its records")
    wait_until(lambda: delta(b, "routed") >= COUNT + 1 + jobs_records, 15, "b routing its records")
    assert delta(c, "passed_over") == 2 * COUNT + jobs_records
    assert delta(c, "routed") == 1 + 3
    assert delta(b, "passed_over") == COUNT + 3
    assert delta(b, "routed") == COUNT + 1 + jobs_records

    # the offline subscriber on c gets what was published while it was away
    sleeper = PahoClient(c.port, "sleeper", version=4, clean=False)
    assert [m.payload for m in sleeper.expect(3, timeout=15)] == [b"s0", b"s1", b"s2"]

    # a later subscriber on c: the retained message at once [MQTT-3.3.1-6], then what is published after
    late = PahoClient(c.port, "late", version=4)
    assert late.subscribe("routing/#", 1) == [1]
    retained = late.expect(1, timeout=15)[0]
    assert (retained.topic, retained.payload, retained.retain) == (status, b"on", True)
    publisher.publish(unwatched, b"after", 1)
    got = late.expect(1, timeout=15)[0]
    assert (got.topic, got.payload) == (unwatched, b"after")
    late.expect_none(0.5)  # none of the records published before it subscribed

    # replaying from the start reads every record from c's own log, the passed-over ones included
    reader = PahoClient(c.port, "reader", version=4)
    assert reader.subscribe(f"$offset/0/{unwatched}", 1) == [1]
    replayed = [m.payload for m in reader.expect(COUNT + 1, timeout=15)]
    assert replayed == [f"u{n}".encode() for n in range(COUNT)] + [b"after"]
