"""The router's ports (``broker_edge.engine.ports``): who serves shared groups, who hears of group
membership, of retained changes and of interest, who publishes wills. A broker alone has none of them and
serves its groups itself."""

from __future__ import annotations

from broker_edge.engine.message import Message
from broker_edge.engine.ports import ClusterPorts
from broker_edge.engine.publish_run import LoggedRun
from broker_edge.engine.routing.router import Router
from broker_edge.engine.routing.subscriptions import SubscriptionOptions
from broker_edge.engine.sessions.session import Session
from broker_edge.protocol.packets import Will
from broker_edge.security.limits import LimitsConfig
from tests.unit.broker_edge.engine.stand_ins import group_members


def _queued(session: Session) -> list[bytes]:
    return [delivery[0].payload for delivery in session.queue or ()]


class Told:
    """Every routing port at once, recording what the router tells it."""

    def __init__(self) -> None:
        self.dispatched: list[bytes] = []
        self.members: list[tuple[str, str, bool]] = []
        self.retained: list[str] = []
        self.interest: list[tuple[str, bool]] = []
        self.wills: list[bytes] = []
        self.given_back: list[bytes] = []

    def dispatch(self, message: Message) -> int:
        self.dispatched.append(message.payload)
        return 1

    def serves(self, topic: str) -> bool:
        return topic.startswith("jobs/")

    def undelivered(self, message: Message) -> None:
        self.given_back.append(message.payload)

    def member_changed(self, group: str, topic_filter: str, joined: bool) -> None:
        self.members.append((group, topic_filter, joined))

    def retained_changed(self, topic: str) -> None:
        self.retained.append(topic)

    def retained_gate(self, send: object) -> bool:
        return False

    def interest_changed(self, topic_filter: str, added: bool) -> None:
        self.interest.append((topic_filter, added))

    def publish_will(self, message: Message) -> None:
        self.wills.append(message.payload)


def _joined(router: Router) -> Told:
    told = Told()
    router.join_cluster(
        ClusterPorts(
            shared_dispatch=told,
            shared_members=told,
            retained_sync=told,
            interest=told,
            wills=told,
        )
    )
    return told


def test_alone_the_router_serves_its_groups_and_a_cluster_dispatcher_replaces_that():
    router = Router(LimitsConfig())
    first, second = group_members(router, "m1", "m2")
    assert router.publish(Message("jobs/1", b"alone", 1)) == 1
    assert _queued(first) + _queued(second) == [b"alone"]

    told = _joined(router)
    router.publish(Message("jobs/2", b"routed", 1))
    router.publish(Message("jobs/3", b"a peer's unlogged copy", 0), groups_served=True)
    assert told.dispatched == [b"routed"]  # the dispatcher decides; a peer's copy is not served again
    assert _queued(first) + _queued(second) == [b"alone"]

    group = router.trie.shared_group("jobs/#", "g")
    assert group is not None and router.trie.shared_group("jobs/#", "other") is None
    member = router.deliver_to_group(group, Message("jobs/4", b"told", 1))
    assert member is not None and _queued(member)[-1] == b"told"


def test_every_join_and_leave_of_a_group_and_of_a_filter_is_told():
    router = Router(LimitsConfig())
    told = _joined(router)
    first, second = group_members(router, "m1", "m2")
    router.unsubscribe(first, "$share/g/jobs/#")
    router.unsubscribe(second, "$share/g/jobs/#")
    assert told.members == [("g", "jobs/#", joined) for joined in (True, True, False, False)]
    assert told.interest == [("jobs/#", added) for added in (True, True, False, False)]


def test_retained_changes_are_told_with_their_topic():
    router = Router(LimitsConfig())
    told = _joined(router)
    router.publish(Message("r/1", b"set", 1, True))
    router.publish(Message("r/1", b"", 1, True))
    router.publish(Message("r/2", b"not retained", 1, False))
    assert told.retained == ["r/1", "r/1"]


def test_a_members_wills_go_to_its_wills_port_a_broker_alones_through_its_publish_path():
    alone = Router(LimitsConfig())
    published: list[bytes] = []
    alone.publish_through = lambda message: published.append(message.payload)
    alone.publish_will(Will("status/a", b"gone", 1, False), "a")
    assert published == [b"gone"]

    member = Router(LimitsConfig())
    member.publish_through = lambda message: published.append(message.payload)
    told = _joined(member)
    member.publish_will(Will("status/b", b"gone too", 1, False), "b")
    assert told.wills == [b"gone too"] and published == [b"gone"]


def _run(topic: str, *payloads: bytes) -> LoggedRun:
    """Logged QoS 1 messages of one publisher on ``topic``, as the PUBLISH path routes them together."""
    return LoggedRun([Message(topic, payload, 1, origin="p", offset=n) for n, payload in enumerate(payloads)])


def test_a_members_run_goes_to_its_subscribers_at_once_unless_a_shared_group_matches_its_topic():
    """In a cluster, a run of logged messages on a topic no shared group matches is routed as one run, as a
    broker alone routes it; on a topic the dispatcher serves, None: each message goes through ``publish``."""
    router = Router(LimitsConfig())
    told = _joined(router)
    subscriber = router.session_type("s")
    for topic_filter in ("metrics/+", "jobs/+"):
        router.subscribe(subscriber, topic_filter, topic_filter, None, SubscriptionOptions(1))

    assert router.publish_run(_run("metrics/1", b"a", b"b")) == 1
    assert _queued(subscriber) == [b"a", b"b"]

    assert router.publish_run(_run("jobs/1", b"c", b"d")) is None
    assert _queued(subscriber) == [b"a", b"b"] and told.dispatched == []
