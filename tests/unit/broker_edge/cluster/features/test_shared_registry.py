"""This broker's members of shared groups, counted per group from the router's joins and leaves (the
``shared_members`` port), and kept in the directory every broker shares (no etcd here: the registry's own
entry only)."""

from __future__ import annotations

from broker_edge.cluster.features.shared_directory import SharedDirectory
from broker_edge.cluster.features.shared_registry import SharedRegistry
from broker_edge.engine.ports import ClusterPorts
from broker_edge.engine.routing.router import Router
from broker_edge.security.limits import LimitsConfig
from tests.unit.broker_edge.engine.stand_ins import group_members


def test_the_registry_counts_this_brokers_members_per_group_from_the_routers_joins_and_leaves():
    router = Router(LimitsConfig())
    directory = SharedDirectory()
    registry = SharedRegistry("a", directory, None, "/timestone", None)
    router.join_cluster(ClusterPorts(shared_members=registry))
    first, second = group_members(router, "m1", "m2")
    assert [set(g.members) for g in directory.match("jobs/1")] == [{"a"}]
    router.unsubscribe(first, "$share/g/jobs/#")
    assert [set(g.members) for g in directory.match("jobs/1")] == [{"a"}]  # m2 is still a member
    router.unsubscribe(second, "$share/g/jobs/#")
    assert directory.match("jobs/1") == []


def test_a_registry_made_after_subscriptions_were_restored_counts_them():
    router = Router(LimitsConfig())
    group_members(router, "m1")
    directory = SharedDirectory()
    registry = SharedRegistry("a", directory, None, "/timestone", None)
    registry.count_existing(router.trie.subscriptions())
    assert [(g.name, g.filter, set(g.members)) for g in directory.match("jobs/1")] == [("g", "jobs/#", {"a"})]
