"""Two brokers' shared-group parts over an in-memory peer link: the leader gives a logged message to the
broker with the member, that broker delivers it and says when it is finished, a lost assignment is sent
again, and a repeated one is neither delivered twice nor left unanswered."""

from __future__ import annotations

import asyncio

from broker_edge.cluster.features.shared_directory import DeliveryKey, SharedDirectory
from broker_edge.cluster.features.shared_groups import SharedGroups
from broker_edge.cluster.links.peer_link import PeerLinks
from broker_edge.cluster.view import ClusterView
from broker_edge.engine.message import Message
from broker_edge.engine.ports import ClusterPorts
from broker_edge.engine.routing.router import Router
from broker_edge.engine.routing.subscriptions import SubscriptionOptions
from broker_edge.engine.sessions.session import Session
from broker_edge.placement import Member, PartitionState
from broker_edge.security.limits import LimitsConfig
from tests.unit.broker_edge.cluster.memory_links import MemoryWire, link_in_memory

PARTITIONS = 2


class _Receiver:
    def forwarded(self, link, batch, messages):  # pragma: no cover - not used
        raise AssertionError

    def unlogged(self, message):  # pragma: no cover - not used
        raise AssertionError


class _Broker:
    def __init__(self, node: str, log: dict[tuple[str, int], Message]) -> None:
        self.router = Router(LimitsConfig())
        self.view = ClusterView(node, PARTITIONS, fenced=False)
        self.links = PeerLinks(node, None, _Receiver())
        self.directory = SharedDirectory()
        self.shared = SharedGroups(
            self.router,
            self.view,
            self.links,
            self.directory,
            asyncio.get_running_loop(),
            lambda topic, offset: log.get((topic, offset)),
            remembered=100,
            resend_s=3600.0,
        )
        self.router.join_cluster(ClusterPorts(shared_dispatch=self.shared))


async def _two_brokers() -> tuple[
    _Broker, _Broker, tuple[MemoryWire, MemoryWire], dict[tuple[str, int], Message]
]:
    log: dict[tuple[str, int], Message] = {}
    a, b = _Broker("a", log), _Broker("b", log)
    members = {node: Member(node, f"{node}:1883", f"http://{node}") for node in "ab"}
    states = {p: PartitionState(p, "a", 1, ("a", "b"), ("a", "b")) for p in range(PARTITIONS)}
    for broker in (a, b):
        broker.view.members = dict(members)
        broker.view.states = dict(states)
    a_to_b, b_to_a = link_in_memory(a.links, b.links)
    a.shared.start()
    b.shared.start()
    for broker in (a, b):
        broker.directory.replace("b", {("g", "jobs/#")})  # b's registry entry, as etcd would have it
    return a, b, (a_to_b, b_to_a), log


def _queued(session: Session) -> list[bytes]:
    return [delivery[0].payload for delivery in session.queue or ()]


def _member(broker: _Broker) -> Session:
    session = broker.router.session_type("worker")
    broker.router.subscribe(session, "$share/g/jobs/#", "jobs/#", "g", SubscriptionOptions(1))
    return session


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_the_leader_assigns_the_member_broker_delivers_and_its_notice_finishes_it():
    asyncio.run(_assigned_delivered_finished())


async def _assigned_delivered_finished():
    a, b, _wires, log = await _two_brokers()
    member = _member(b)
    message = log[("jobs/1", 7)] = Message("jobs/1", b"job", 1, offset=7)
    key = DeliveryKey("jobs/1", 7, "g", "jobs/#")

    assert b.router.publish(message) == 0  # a follower routing the record does not serve the group
    assert a.router.publish(message) == 1  # its leader does
    await _settle()
    assert _queued(member) == [b"job"]
    assert a.shared.deliveries.assigned == {key: "b"}

    member.clear_outgoing()  # acknowledged (or dropped): the session lets go of it
    await _settle()
    assert len(a.shared.deliveries) == 0 and len(b.shared.deliveries) == 0
    assert a.shared.deliveries.known(key)  # and never assigned again
    a.router.publish(message)
    await _settle()
    assert member.queue is None


def test_a_lost_assignment_is_sent_again_and_a_repeated_one_is_not_delivered_twice():
    asyncio.run(_lost_and_repeated())


async def _lost_and_repeated():
    a, b, (wire, back), log = await _two_brokers()
    member = _member(b)
    message = log[("jobs/2", 3)] = Message("jobs/2", b"lost once", 1, offset=3)
    key = DeliveryKey("jobs/2", 3, "g", "jobs/#")
    wire.lost = True
    a.router.publish(message)
    await _settle()
    assert member.queue is None  # the link dropped it
    wire.lost = False

    a.shared._sent_at[key] -= a.shared.resend_s  # as if resend_s had passed
    a.shared._resend_unfinished()
    await _settle()
    assert _queued(member) == [b"lost once"]
    a.shared._sent_at[key] -= a.shared.resend_s
    a.shared._resend_unfinished()  # while b delivers it: ignored
    await _settle()
    assert len(member.queue or ()) == 1

    back.lost = True  # b's notice is lost this time
    member.clear_outgoing()
    await _settle()
    assert a.shared.deliveries.assigned == {key: "b"}
    back.lost = False
    a.shared._sent_at[key] -= a.shared.resend_s
    a.shared._resend_unfinished()  # b has finished it: it repeats its notice, delivers nothing
    await _settle()
    assert member.queue is None
    assert len(a.shared.deliveries) == 0


def test_only_a_broker_that_leads_or_led_a_partition_may_assign_its_records():
    asyncio.run(_may_assign())


async def _may_assign():
    a, b, _wires, _log = await _two_brokers()
    assert a.shared.may_assign("jobs/1") and not b.shared.may_assign("jobs/1")  # b would route to nobody
    b.view.states = {p: PartitionState(p, "b", 2, ("b", "a"), ("b", "a")) for p in range(PARTITIONS)}
    b.view.changed()
    assert b.shared.may_assign("jobs/1")  # b leads now
    b.view.states = {p: PartitionState(p, "a", 3, ("a", "b"), ("a", "b")) for p in range(PARTITIONS)}
    b.view.changed()
    assert b.shared.may_assign("jobs/1")  # records appended while b led may still be routed here
