"""The router's hooks for a cluster member: who serves shared groups, who hears of group membership and
of retained changes. A broker alone sets none of them and serves its groups itself."""

from __future__ import annotations

from broker_edge.cluster.features.shared_directory import SharedDirectory
from broker_edge.cluster.features.shared_registry import SharedRegistry
from broker_edge.engine.message import Message
from broker_edge.engine.routing.router import Router
from broker_edge.engine.routing.subscriptions import SubscriptionOptions
from broker_edge.engine.sessions.session import Session
from broker_edge.security.limits import LimitsConfig


def _members(router: Router, *names: str) -> list[Session]:
    sessions = []
    for name in names:
        session = router.session_type(name)
        router.subscribe(session, "$share/g/jobs/#", "jobs/#", "g", SubscriptionOptions(1))
        sessions.append(session)
    return sessions


def _queued(session: Session) -> list[bytes]:
    return [delivery[0].payload for delivery in session.queue or ()]


def test_alone_the_router_serves_its_groups_and_a_cluster_dispatcher_replaces_that():
    router = Router(LimitsConfig())
    first, second = _members(router, "m1", "m2")
    assert router.publish(Message("jobs/1", b"alone", 1)) == 1
    assert _queued(first) + _queued(second) == [b"alone"]

    dispatched: list[bytes] = []
    router.shared_dispatch = lambda message: dispatched.append(message.payload) or 1
    router.publish(Message("jobs/2", b"routed", 1))
    router.publish(Message("jobs/3", b"a peer's unlogged copy", 0), groups_served=True)
    assert dispatched == [b"routed"]  # the dispatcher decides; a peer's copy is not served again
    assert _queued(first) + _queued(second) == [b"alone"]

    group = router.trie.shared_group("jobs/#", "g")
    assert group is not None and router.trie.shared_group("jobs/#", "other") is None
    member = router.deliver_to_group(group, Message("jobs/4", b"told", 1))
    assert member is not None and _queued(member)[-1] == b"told"


def test_membership_is_told_on_every_join_and_leave_and_the_registry_counts_members_per_group():
    router = Router(LimitsConfig())
    directory = SharedDirectory()
    registry = SharedRegistry("a", directory, None, "/timestone", None)
    router.shared_membership = registry.member_changed
    first, second = _members(router, "m1", "m2")
    assert [set(g.members) for g in directory.match("jobs/1")] == [{"a"}]
    router.unsubscribe(first, "$share/g/jobs/#")
    assert [set(g.members) for g in directory.match("jobs/1")] == [{"a"}]  # m2 is still a member
    router.unsubscribe(second, "$share/g/jobs/#")
    assert directory.match("jobs/1") == []


def test_a_registry_made_after_subscriptions_were_restored_counts_them():
    router = Router(LimitsConfig())
    _members(router, "m1")
    directory = SharedDirectory()
    registry = SharedRegistry("a", directory, None, "/timestone", None)
    registry.count_existing(router.trie.subscriptions())
    assert [(g.name, g.filter, set(g.members)) for g in directory.match("jobs/1")] == [("g", "jobs/#", {"a"})]


def test_retained_changes_are_told_with_their_topic():
    router = Router(LimitsConfig())
    changed: list[str] = []
    router.retained_changed = changed.append
    router.publish(Message("r/1", b"set", 1, True))
    router.publish(Message("r/1", b"", 1, True))
    router.publish(Message("r/2", b"not retained", 1, False))
    assert changed == ["r/1", "r/1"]
