"""Which partitions a broker's subscriptions want (``LocalInterest``): exact filters name one partition, a
wildcard wants them all, listeners hear only when that set changes."""

from __future__ import annotations

from broker_edge.cluster.interest import LocalInterest, is_wildcard
from broker_edge.cluster.view import ClusterView


def test_exact_filters_want_their_partition_and_a_wildcard_wants_all() -> None:
    view = ClusterView("b1", 16)
    interest = LocalInterest(view)
    changes: list[None] = []
    interest.on_change(lambda: changes.append(None))
    topic = "plant/1/telemetry"
    partition = view.partition_of(topic)
    other = next(number for number in range(16) if number != partition)
    assert not interest.wants(partition)

    interest.changed(topic, True)
    interest.changed(topic, True)  # a second subscriber of the same topic changes nothing
    assert interest.wants(partition) and not interest.wants(other)
    assert len(changes) == 1

    interest.changed("plant/+/telemetry", True)
    assert interest.everything and interest.wants(other)
    assert len(changes) == 2
    interest.changed("plant/+/telemetry", False)
    assert not interest.wants(other) and interest.wants(partition)
    assert len(changes) == 3

    interest.changed(topic, False)
    assert interest.wants(partition)  # one subscriber left
    interest.changed(topic, False)
    assert not interest.wants(partition)
    assert len(changes) == 4
    interest.changed(topic, False)  # never counted: ignored
    assert len(changes) == 4


def test_existing_subscriptions_count_and_a_new_partition_count_places_them_again() -> None:
    view = ClusterView("b1", 16)
    interest = LocalInterest(view)
    interest.count_existing([("a/b", object(), None, None), ("c/#", object(), None, "group")])
    assert interest.everything
    interest.changed("c/#", False)
    assert interest.wants(view.partition_of("a/b"))
    view.partitions = 7  # the count stored in etcd wins over the configuration
    assert interest.wants(view.partition_of("a/b"))
    assert sum(interest.wants(number) for number in range(7)) == 1


def test_wildcards() -> None:
    assert is_wildcard("#") and is_wildcard("a/+/c") and is_wildcard("a/#")
    assert not is_wildcard("a/b/c")
