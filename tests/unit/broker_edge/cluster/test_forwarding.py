"""The forwarding broker's path (``broker_edge.cluster.forwarding``) without a broker: two engines (a real
router and PUBLISH path each, on the event loop, logs in memory) joined by peer links in memory, each with a
view the test writes. A device's publish on the broker that does not lead the topic's partition is appended
by the leader and answered with its offset; refusals, "not the leader" answers and the wait for a leader."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from broker_edge.cluster.forwarding import ClusterForwarding
from broker_edge.cluster.links.handoff import ConnectionHandoff
from broker_edge.cluster.links.peer_link import PeerLinks
from broker_edge.cluster.view import ClusterView
from broker_edge.engine.connection.states import CLOSED
from broker_edge.engine.message import Message
from broker_edge.engine.ports import ClusterPorts
from broker_edge.placement import Member, PartitionState
from tests.unit.broker_edge.cluster.engines import Answers, EngineOnLoop
from tests.unit.broker_edge.cluster.memory_links import link_in_memory

PARTITIONS = 4
TOPIC = "plant/line-1/meter"


class Node:
    """One cluster member: its engine, view, peer links and forwarding port (registered as its ports)."""

    def __init__(self, node_id: str, min_insync_replicas: int = 1, forward_timeout_s: float = 2.0) -> None:
        self.engine = EngineOnLoop()
        self.view = ClusterView(node_id, PARTITIONS, fenced=False)
        loop = asyncio.get_running_loop()
        self.forwarding = ClusterForwarding(
            self.view,
            self.engine.publish_path,
            self.engine.router,
            None,
            loop,
            min_insync_replicas,
            forward_timeout_s,
        )
        self.links = self.forwarding.links = PeerLinks(node_id, None, self.forwarding)
        self.engine.join_cluster(ClusterPorts(forwarding=self.forwarding))

    def lead(self, leader: str | None, isr: tuple[str, ...] = ("a", "b")) -> None:
        """Every partition led by ``leader`` (None: no leader), as this member's view says."""
        self.view.members = {node: Member(node, f"{node}:1883", f"http://{node}") for node in ("a", "b")}
        self.view.states = {p: PartitionState(p, leader, 1, ("a", "b"), isr) for p in range(PARTITIONS)}
        self.view.changed()

    def publish(self, device: Answers, payload: bytes, packet_id: int = 1) -> Message:
        message = Message(TOPIC, payload, 1, False, None, "device")
        self.engine.publish_path.accept(device, message, packet_id, logged=True)
        return message


def _led_by_b() -> tuple[Node, Node]:
    """Members ``a`` and ``b``, both seeing ``b`` lead every partition (not linked yet)."""
    a, b = Node("a"), Node("b")
    for member in (a, b):
        member.lead("b")
    return a, b


async def _answered(device: Answers) -> None:
    await asyncio.wait_for(device.answered.wait(), 5)


def _run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def test_a_publish_on_a_partition_led_elsewhere_is_appended_by_the_leader_and_answered_with_its_offset():
    async def scenario() -> None:
        a, b = _led_by_b()
        link_in_memory(a.links, b.links)
        device = Answers()
        message = a.publish(device, b"21.5")
        await _answered(device)
        assert device.answers == {1: (0x00, None)}  # appended (a cluster never answers 0x10)
        assert TOPIC not in a.engine.log.logs and len(b.engine.log.logs[TOPIC]) == 1
        assert message.offset == 0  # the leader's offset, the same on every replica

    _run(scenario)


def test_too_few_in_sync_replicas_on_the_leader_refuses_at_once_with_the_reason():
    async def scenario() -> None:
        a = Node("a", min_insync_replicas=2)
        a.lead("a", isr=("a",))
        device = Answers()
        a.publish(device, b"at risk")
        await _answered(device)
        ((code, reason),) = device.answers.values()
        assert code == 0x83
        assert reason is not None and "1 in-sync replicas, fewer than min_insync_replicas 2" in reason
        assert a.engine.log.logs == {}

    _run(scenario)


def test_a_broker_that_no_longer_leads_answers_not_leader_and_the_publish_follows_the_new_leader():
    """The forwarding broker's view is behind: it forwards to ``b``, which answers "not the leader" (a
    publish a peer forwarded is never forwarded again); once the view names the new leader (here: the
    forwarding broker itself) the publish goes there, within ``forward_timeout_ms``."""

    async def scenario() -> None:
        a, b = Node("a"), Node("b")
        a.lead("b")
        b.lead("a")
        link_in_memory(a.links, b.links)
        device = Answers()
        a.publish(device, b"moved")
        while not b.engine.counters.drops("forward_refused"):  # b answered it: not the leader
            await asyncio.sleep(0.005)
        assert device.answers == {}  # a sends it on rather than refuse it
        a.lead("a")
        await _answered(device)
        assert device.answers == {1: (0x00, None)}
        assert len(a.engine.log.logs[TOPIC]) == 1 and TOPIC not in b.engine.log.logs

    _run(scenario)


def test_without_a_leader_within_forward_timeout_the_publish_is_refused():
    async def scenario() -> None:
        a = Node("a", forward_timeout_s=0.1)
        a.lead(None)
        device = Answers()
        a.publish(device, b"nobody leads")
        await _answered(device)
        ((code, reason),) = device.answers.values()
        assert code == 0x83 and reason is not None and "no leader for partition" in reason

    _run(scenario)


def test_an_mqtt_3_publisher_refused_elsewhere_is_disconnected_never_acknowledged():
    async def scenario() -> None:
        a = Node("a", min_insync_replicas=2)
        a.lead("a", isr=("a",))
        device = Answers(v5=False)
        a.publish(device, b"old device")
        await _answered(device)
        assert device.closed and device.answers == {}

    _run(scenario)


# -- a publisher's order on its topic, whatever the forwarding path waits for --------------------------------


def _payloads(node: Node) -> list[bytes]:
    return [record[0] for record in node.engine.log.logs.get(TOPIC, [])]


async def _all_answered(device: Answers, count: int) -> None:
    while len(device.answers) < count and not device.closed:
        await asyncio.wait_for(device.answered.wait(), 5)
        device.answered.clear()


def test_a_publish_answered_not_the_leader_is_retried_ahead_of_the_publishes_sent_after_it():
    """The leader is fenced for a moment: it answers the first publish "not the leader", then unfences
    before the second arrives. The second waits behind the first's retry, so the log holds them in the
    order the device sent them (before, the second was appended at once and the first 20 ms later)."""

    async def scenario() -> None:
        a, b = _led_by_b()
        link_in_memory(a.links, b.links)
        device = Answers()
        b.view.fenced = True
        a.publish(device, b"394", packet_id=1)
        while not b.engine.counters.drops("forward_refused"):
            await asyncio.sleep(0.001)
        b.view.fenced = False
        a.publish(device, b"395", packet_id=2)
        a.publish(device, b"396", packet_id=3)
        await _all_answered(device, 3)
        assert device.answers == {1: (0x00, None), 2: (0x00, None), 3: (0x00, None)}
        assert _payloads(b) == [b"394", b"395", b"396"]

    _run(scenario)


def test_publishes_sent_while_an_earlier_one_waits_for_its_link_go_behind_it():
    async def scenario() -> None:
        a, b = _led_by_b()
        device = Answers()
        a.publish(device, b"1", packet_id=1)  # no link to b yet: waits
        await asyncio.sleep(0.03)
        link_in_memory(a.links, b.links)
        a.publish(device, b"2", packet_id=2)  # the link is up: still behind the first
        await _all_answered(device, 2)
        assert _payloads(b) == [b"1", b"2"]
        assert [code for code, _ in device.answers.values()] == [0x00, 0x00]

    _run(scenario)


def test_when_this_broker_becomes_the_leader_a_later_publish_is_not_appended_ahead_of_one_waiting():
    async def scenario() -> None:
        a = Node("a")
        a.lead(None)
        device = Answers()
        a.publish(device, b"first", packet_id=1)  # no leader: waits
        await asyncio.sleep(0)
        a.lead("a")
        a.publish(device, b"second", packet_id=2)  # a leads now, but "first" is still waiting
        await _all_answered(device, 2)
        assert _payloads(a) == [b"first", b"second"]

    _run(scenario)


def test_publishes_waiting_for_a_leader_go_ahead_of_a_later_one_read_just_before_this_broker_leads():
    """The view names this broker the leader in the loop turn that read the device's next publish: that
    publish is queued, not yet placed, when the waiting ones enter this broker's own PUBLISH path. The
    log holds them in the order the device sent them (before, the later one was appended first)."""

    async def scenario() -> None:
        a = Node("a")
        a.lead(None)
        device = Answers()
        a.publish(device, b"1", packet_id=1)  # no leader: waits in its lane
        await asyncio.sleep(0.001)
        a.publish(device, b"2", packet_id=2)  # read; placed at the next turn of the loop
        a.lead("a")
        a.forwarding.retry()  # what a view change does (``ClusterNode``)
        await _all_answered(device, 2)
        assert device.answers == {1: (0x00, None), 2: (0x00, None)}
        assert _payloads(a) == [b"1", b"2"]

    _run(scenario)


def test_publishes_behind_a_forward_answered_after_this_broker_took_the_lead_keep_their_place():
    """The old leader's answer to a forward comes once this broker leads: the publishes queued behind that
    forward enter this broker's own PUBLISH path ahead of a later one read before the answer came."""

    async def scenario() -> None:
        a, b = _led_by_b()
        _a_to_b, b_to_a = link_in_memory(a.links, b.links)
        await asyncio.sleep(0.01)  # the links learn their format
        device = Answers()
        b_to_a.held = []
        a.publish(device, b"1", packet_id=1)  # on its way to b, its answer held
        while not b_to_a.held:
            await asyncio.sleep(0.001)
        a.publish(device, b"2", packet_id=2)  # behind "1" in the lane
        await asyncio.sleep(0.001)
        a.lead("a")
        a.publish(device, b"3", packet_id=3)  # read; placed at the next turn of the loop
        b_to_a.release()  # "1" appended by b: "2" goes into a's own PUBLISH path
        await _all_answered(device, 3)
        assert device.answers == {1: (0x00, None), 2: (0x00, None), 3: (0x00, None)}
        assert _payloads(b) == [b"1"] and _payloads(a) == [b"2", b"3"]

    _run(scenario)


def test_a_publish_that_cannot_keep_its_place_is_refused_with_everything_behind_it():
    async def scenario() -> None:
        a = Node("a", forward_timeout_s=0.05)
        a.lead(None)
        device = Answers()
        a.publish(device, b"1", packet_id=1)
        await asyncio.sleep(0.01)
        a.publish(device, b"2", packet_id=2)  # its own deadline is later, but it cannot pass the first
        await _all_answered(device, 2)
        assert [code for code, _ in device.answers.values()] == [0x83, 0x83]
        a.lead("a")
        a.publish(device, b"3", packet_id=3)
        await _all_answered(device, 3)
        assert device.answers[3] == (0x00, None) and _payloads(a) == [b"3"]

    _run(scenario)


def test_publishes_waiting_when_their_publisher_disconnects_are_refused_not_appended_later():
    """A device whose connection ends while its publishes wait may already publish again elsewhere: the
    waiting ones are refused when they would go, never appended behind its newer ones."""

    async def scenario() -> None:
        a = Node("a")
        a.lead(None)
        device = Answers()
        a.publish(device, b"1", packet_id=1)
        await asyncio.sleep(0)
        device.state = CLOSED
        a.lead("a")
        a.publish(Answers(), b"another device's", packet_id=1)  # the topic is open again at once
        await asyncio.sleep(0.1)  # past the retry
        assert _payloads(a) == [b"another device's"]
        assert device.answers == {}  # a closed connection is told nothing

    _run(scenario)


def test_a_takeover_waits_until_the_old_connections_forwarded_publishes_have_their_place():
    """A session taken over elsewhere answers only once its client's publishes still travelling from here
    are appended or refused (``ClusterSessions`` awaits ``settle``), so a device that reconnects to
    another broker cannot have its next publish appended ahead of them."""

    async def scenario() -> None:
        a, b = _led_by_b()
        device = Answers()
        a.publish(device, b"1", packet_id=1)  # no link to b yet: waits in its lane
        await asyncio.sleep(0.001)  # persisted at the next turn of the loop
        assert a.forwarding.carries("device") and not a.forwarding.carries("another")
        assert await a.forwarding.settle("device", timeout_s=0.05) is False
        settled = asyncio.ensure_future(a.forwarding.settle("device", timeout_s=2))
        await asyncio.sleep(0.03)
        assert not settled.done()
        link_in_memory(a.links, b.links)
        assert await settled is True
        assert _payloads(b) == [b"1"]
        assert await a.forwarding.settle("another", timeout_s=0) is True

    _run(scenario)


class _Movable:
    """A connection that may move (``may``), recording that it was held for it."""

    def __init__(self, may: bool) -> None:
        self.may = may
        self.held = False

    def may_move(self) -> bool:
        return self.may

    def hold_for_handover(self) -> None:
        self.held = True

    def handover_record(self) -> None:
        return None

    def resume_after_handover(self, unread: bytes = b"") -> None:
        self.held = False


def test_a_movable_publisher_is_handed_over_only_to_a_leader_on_this_host():
    """``hand_over``: a connection that may move is held for moving to the leader of its topic's partition
    when that member advertises a handoff socket; not one that may not, nor one with no socket to move (a
    WebSocket's), nor where this member leads, nor to a leader advertising none."""

    async def scenario() -> None:
        a, _ = _led_by_b()
        handoff = a.forwarding.handoff = ConnectionHandoff("a", asyncio.get_running_loop(), lambda *_: None)
        try:
            assert a.forwarding.moves_publishers
            movable = _Movable(may=True)
            assert not a.forwarding.hand_over(TOPIC, movable), "b advertises no handoff socket"
            a.view.members["b"] = Member("b", "b:1883", "http://b", None, "timestone-handoff-" + "1" * 32)
            assert not a.forwarding.hand_over(TOPIC, Answers()), "nothing to move"
            assert not a.forwarding.hand_over(TOPIC, _Movable(may=False))
            assert a.forwarding.hand_over(TOPIC, movable) and movable.held
            a.lead("a")
            assert not a.forwarding.hand_over(TOPIC, _Movable(may=True)), "led here"
        finally:
            handoff.close()
        assert not movable.held, "read again once the handoff end closes"

    _run(scenario)
