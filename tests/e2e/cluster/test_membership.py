"""Membership, controller election, failover and fencing on a real etcd.

Broker processes (``timestone broker`` with a ``cluster:`` section) show what an operator sees: members
registered with their bound addresses, gone with their lease, one controller. The elections are driven
with the coordination objects of several nodes in this process (membership, coordinator, controller, each
with its own etcd connection), acting as the leaders' data side would: a leader adds a follower to the
in-sync set once it has caught up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from broker_edge.cluster.coordination.assignment import leader_counts
from broker_edge.cluster.coordination.controller import Controller
from broker_edge.cluster.coordination.coordinator import Coordinator
from broker_edge.cluster.coordination.etcd import ClusterKeys, Etcd, WatchEvent
from broker_edge.cluster.coordination.membership import Membership, fence_margin_s
from broker_edge.cluster.view import ClusterView
from broker_edge.offsets_api.server import serve
from broker_edge.placement import Member, partition_of
from broker_edge.runtime.launcher import BrokerProcess, free_port
from broker_edge.settings.cluster import ClusterConfig
from broker_edge.storage import AppendRecord, LogStore, StorageConfig
from tests.e2e.cluster.conftest import EtcdTarget
from tests.e2e.cluster.proof import logged as broker_log_count
from tests.harness.cpu_waits import longest_wait_s, run_queue_waits

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")
TTL = 2


def run(coroutine: Coroutine[Any, Any, T], timeout_s: float = 60) -> T:
    return asyncio.run(asyncio.wait_for(coroutine, timeout_s))


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout_s: float, what: str) -> float:
    """Poll ``check`` until true; the seconds it took. Fails the test naming ``what`` after ``timeout_s``."""
    start = time.monotonic()
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)


async def read_prefix(target: EtcdTarget) -> dict[str, Any]:
    """Every key of the test's cluster, JSON-decoded where it is JSON."""
    etcd = target.client()
    try:
        kvs, _ = await etcd.get_prefix(f"{target.prefix}/")
    finally:
        await etcd.close()
    result: dict[str, Any] = {}
    for kv in kvs:
        name = kv.key[len(target.prefix) + 1 :]
        try:
            result[name] = json.loads(kv.value)
        except ValueError:
            result[name] = kv.value.decode()
    return result


class Node:
    """The coordination side of one cluster node in this process (no MQTT, no log unless ``store``)."""

    def __init__(
        self, target: EtcdTarget, node_id: str, offsets_api: str | None = None, **cluster: Any
    ) -> None:
        settings: dict[str, Any] = {"lease_ttl_s": TTL, "partitions": 6, "key_prefix": target.prefix}
        settings.update(cluster)
        self.config = ClusterConfig(
            node_id, [target.url], etcd_tls=target.server.tls, etcd_auth=target.auth, **settings
        )
        self.view = ClusterView(node_id, self.config.partitions)
        self.keys = ClusterKeys(target.prefix)
        self.etcd = target.client(timeout_s=1.0)
        # nothing listens at an address from free_port(): such a member does not answer for its log ends
        api = offsets_api or f"http://127.0.0.1:{free_port()}"
        self.member = Member(node_id, f"127.0.0.1:{free_port()}", api, f"https://127.0.0.1:{free_port()}")
        self.membership = Membership(self.etcd, self.keys, self.member, self.view, self.config.lease_ttl_s)
        self.coordinator = Coordinator(self.etcd, self.keys, self.view, self.membership)
        self.membership.before_unfence = self.coordinator.resync
        self.controller = Controller(
            self.etcd, self.keys, self.view, self.coordinator, self.membership, self.config
        )

    @property
    def node_id(self) -> str:
        return self.member.node_id

    async def start(self) -> Node:
        await self.coordinator.start()
        await self.membership.start()
        await self.controller.start()
        return self

    async def stop(self) -> None:
        await self.controller.stop()
        await self.membership.stop()
        await self.coordinator.stop()
        await self.etcd.close()

    async def die(self) -> None:
        """Stop renewing the lease without a word to etcd, as a hung or cut-off process would."""
        self.membership.abandon()
        await self.controller.stop(resign=False)
        await self.coordinator.stop()

    async def catch_up_followers(self) -> None:
        """What this node's leader side does once its followers have fetched everything: add them to the
        in-sync set of the partitions it leads."""
        for partition, state in list(self.view.states.items()):
            if state.leader == self.node_id:
                for node in state.replicas:
                    if node not in state.isr and node in self.view.members:
                        await self.coordinator.expand_isr(partition, state.epoch, node)


async def start_nodes(target: EtcdTarget, names: list[str], **cluster: Any) -> list[Node]:
    return [await Node(target, name, **cluster).start() for name in names]


async def settled(nodes: list[Node], partitions: int, replicas: int) -> None:
    """Wait until every partition has ``replicas`` replicas, all in sync, and every node sees it so."""

    def done() -> bool:
        for node in nodes:
            states = node.view.states
            if len(states) != partitions or set(node.view.members) != {n.node_id for n in nodes}:
                return False
            for state in states.values():
                if len(state.replicas) != replicas or set(state.isr) != set(state.replicas):
                    return False
        return True

    async def step() -> bool:
        for node in nodes:
            await node.catch_up_followers()
        return done()

    await eventually(step, 20, f"{partitions} partitions with {replicas} in-sync replicas each")


def spread(view: ClusterView) -> list[int]:
    return sorted(leader_counts(view.states.values(), view.members).values())


# -- broker processes ---------------------------------------------------------------------------------------


def test_a_broker_registers_its_bound_addresses_and_vanishes_with_its_lease(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> None:
    b1 = cluster_brokers("b1", lease_ttl_s=TTL)
    b2 = cluster_brokers("b2", lease_ttl_s=TTL)

    async def scenario() -> tuple[float, float]:
        async def members() -> dict[str, Any]:
            return {
                k[len("members/") :]: v
                for k, v in (await read_prefix(etcd)).items()
                if k.startswith("members/")
            }

        await eventually(lambda: _has(members(), {"b1", "b2"}), 15, "both brokers registered")
        registered = await members()
        peer = registered["b1"].pop("peer")
        assert registered["b1"] == {
            "node_id": "b1",
            "mqtt": f"127.0.0.1:{b1.port}",
            "offsets_api": f"http://127.0.0.1:{b1.offsets_port}",
        }
        # the members' endpoint, on its own port: TLS with the cluster CA (the tests run as production does)
        assert peer.startswith("https://127.0.0.1:") and peer != f"https://127.0.0.1:{b1.offsets_port}"
        b1.kill()  # SIGKILL: its lease is renewed by nobody
        killed_for = await eventually(lambda: _lacks(members(), "b1"), TTL + 5, "b1 gone after kill -9")
        b2.stop()  # SIGTERM: it revokes its lease on the way out
        stopped_for = await eventually(lambda: _lacks(members(), "b2"), 5, "b2 gone after SIGTERM")
        return killed_for, stopped_for

    killed_for, stopped_for = run(scenario())
    assert killed_for <= TTL + 1.0  # etcd ends a lease TTL after its last renewal (renewed every TTL/3)
    assert stopped_for < 1.0


async def _has(members: Awaitable[dict[str, Any]], names: set[str]) -> bool:
    return names <= set(await members)


async def _lacks(members: Awaitable[dict[str, Any]], name: str) -> bool:
    return name not in await members


def test_brokers_elect_one_controller_that_creates_the_cluster_and_a_new_one_when_it_dies(
    cluster_brokers: Callable[..., BrokerProcess], etcd: EtcdTarget
) -> None:
    brokers = {name: cluster_brokers(name, lease_ttl_s=TTL, partitions=8) for name in ("b1", "b2", "b3")}

    async def scenario() -> tuple[str, str, dict[str, Any]]:
        async def created() -> bool:
            keys = await read_prefix(etcd)
            states = [v for k, v in keys.items() if k.startswith("partitions/")]
            return len(states) == 8 and all(len(s["replicas"]) == 3 for s in states)

        try:
            await eventually(created, 20, "8 partitions with 3 replicas each")
        except AssertionError as failure:
            logs = "\n".join(f"--- {n}\n{b.log_path.read_text()[-4000:]}" for n, b in brokers.items())
            raise AssertionError(f"{failure}\n{await read_prefix(etcd)}\n{logs}") from None
        keys = await read_prefix(etcd)
        first = keys["controller"]
        await asyncio.sleep(1.5)  # time for a second controller to appear, if one could
        assert (await read_prefix(etcd))["controller"] == first
        brokers[first].kill()

        async def replaced() -> bool:
            controller = (await read_prefix(etcd)).get("controller")
            return controller is not None and controller != first

        await eventually(replaced, TTL + 5, "another controller after the first was killed")
        return first, (await read_prefix(etcd))["controller"], keys

    first, second, keys = run(scenario())
    assert keys["config"] == {"partitions": 8}
    assert {s["leader"] for k, s in keys.items() if k.startswith("partitions/")} <= {"b1", "b2", "b3"}
    logs = {name: broker.log_path.read_text() for name, broker in brokers.items()}
    counts = {name: text.count(f"{name} is the controller") for name, text in logs.items()}
    assert counts == {name: 1 if name in (first, second) else 0 for name in brokers}


# -- elections, driven in this process --------------------------------------------------------------------


def test_failover_elects_a_live_in_sync_replica_with_the_next_epoch_and_drops_the_dead_one(
    etcd: EtcdTarget,
) -> None:
    async def scenario() -> None:
        nodes = await start_nodes(etcd, ["b1", "b2", "b3"])
        try:
            await settled(nodes, 6, 3)
            observer = nodes[2].view
            await eventually(lambda: spread(observer) == [2, 2, 2], 10, "leadership spread 2/2/2")
            before = dict(observer.states)
            dead = nodes[0]
            led = sorted(p for p, s in before.items() if s.leader == dead.node_id)
            assert len(led) == 2
            await dead.die()
            survivors = nodes[1:]

            def failed_over() -> bool:
                view = survivors[0].view
                return all(view.states[p].leader not in (None, dead.node_id) for p in led) and all(
                    dead.node_id not in s.isr for s in view.states.values()
                )

            # the bound is the members' and etcd's: less the longest a thread of theirs waited for a CPU
            etcd_pid = etcd.server.process.pid if etcd.server.process else "self"
            waits_before = run_queue_waits(), run_queue_waits(etcd_pid)
            took = await eventually(failed_over, TTL + 5, "partitions of b1 led by survivors")
            waits_after = run_queue_waits(), run_queue_waits(etcd_pid)
            waited = max(map(longest_wait_s, waits_before, waits_after))
            assert took - waited <= TTL + 2.5, f"failed over in {took:.2f} s, {waited:.2f} s of it waiting"
            after = survivors[0].view.states
            for p in led:
                assert after[p].leader in {"b2", "b3"}
                assert after[p].leader in before[p].isr
                assert after[p].epoch == before[p].epoch + 1
                assert after[p].isr == tuple(n for n in before[p].isr if n != "b1")
            for p in set(before) - set(led):
                assert after[p].leader == before[p].leader  # live leaders keep theirs
                assert after[p].epoch == before[p].epoch
            assert sorted(leader_counts(after.values(), {"b2", "b3"}).values()) == [3, 3]
            await eventually(lambda: survivors[1].view.states == after, 5, "the other survivor sees it too")
        finally:
            for node in nodes:
                await node.stop()

    run(scenario())


def test_a_new_member_gets_replicas_then_its_share_of_leadership(etcd: EtcdTarget) -> None:
    async def scenario() -> None:
        nodes = await start_nodes(etcd, ["b1", "b2"], replication_factor=3, min_insync_replicas=2)
        try:
            await settled(nodes, 6, 2)  # replication factor capped at the two live members
            await eventually(lambda: spread(nodes[0].view) == [3, 3], 10, "leadership 3/3")
            before = dict(nodes[0].view.states)
            nodes.append(await Node(etcd, "b3").start())
            await settled(nodes, 6, 3)  # b3 added to every replica set, then caught up
            view = nodes[2].view
            await eventually(lambda: spread(view) == [2, 2, 2], 10, "leadership 2/2/2 with b3")
            led = [p for p, s in view.states.items() if s.leader == "b3"]
            assert len(led) == 2
            for p in led:
                assert view.states[p].epoch == before[p].epoch + 1  # one move per partition
                assert view.leads(p)
        finally:
            for node in nodes:
                await node.stop()

    run(scenario())


def test_every_view_tells_a_member_registered_again_by_its_registration_revision(etcd: EtcdTarget) -> None:
    """A member's record is written once per registration: a process back under the same node id after its
    lease ended is told from the one before by the revision its record was written at (a leader keeps its
    former process's fetch session no longer: ``FetchServer.forget_departed``)."""

    async def scenario() -> None:
        b1, b2 = await start_nodes(etcd, ["b1", "b2"])
        again: Node | None = None
        try:
            assert b2.membership.registration is not None
            first = b2.membership.registration[1]
            await eventually(lambda: b1.view.registrations.get("b2") == first, 10, "b2's registration seen")
            assert b2.view.registrations.get("b2") == first
            await b2.die()
            await eventually(lambda: "b2" not in b1.view.members, TTL + 5, "b2 gone with its lease")
            assert "b2" not in b1.view.registrations
            again = await Node(etcd, "b2").start()
            assert again.membership.registration is not None
            second = again.membership.registration[1]
            assert second > first
            await eventually(lambda: b1.view.registrations.get("b2") == second, 10, "the new one seen")
            assert "b2" in b1.view.members
        finally:
            for node in (b1, again):
                if node is not None:
                    await node.stop()
            await b2.etcd.close()

    run(scenario())


def test_election_prefers_the_in_sync_replica_with_the_highest_log_end(
    etcd: EtcdTarget, tmp_path: Path
) -> None:
    """Each node's advertised offsets API is a real one over a real store: b3 holds more of the partition's
    records than b2, so b3 leads after b1, although b2 comes first by name."""
    topics = [f"plant/{i}/meter" for i in range(40)]

    async def scenario() -> None:
        runners = []
        nodes: list[Node] = []
        try:
            for name, records in (("b1", 5), ("b2", 3), ("b3", 5)):
                store = LogStore(tmp_path / name, StorageConfig(durability="none"))
                store.open()
                for topic in topics:
                    for number in range(records):
                        store.append(topic, AppendRecord(f"{name} {number}".encode()))
                store.flush()
                runner, port = await serve(store, "127.0.0.1", 0)
                runners.append((runner, store))
                node = Node(etcd, name, f"http://127.0.0.1:{port}", partitions=1)
                nodes.append(await node.start())
            await settled(nodes, 1, 3)
            await eventually(lambda: nodes[0].view.states[0].leader is not None, 5, "a leader")
            assert nodes[0].view.states[0].leader == "b1"  # the first member leads the one partition
            await nodes[0].die()
            view = nodes[1].view
            await eventually(lambda: view.states[0].leader not in ("b1", None), TTL + 5, "a new leader")
            assert view.states[0].leader == "b3"
            assert all(partition_of(t, 1) == 0 for t in topics)
        finally:
            for node in nodes:
                await node.stop()
            for runner, store in runners:
                await runner.cleanup()
                store.close()

    run(scenario())


# -- fencing ------------------------------------------------------------------------------------------------


def test_a_node_that_cannot_reach_etcd_fences_itself_within_the_ttl_and_unfences_after(
    private_etcd: EtcdTarget,
) -> None:
    async def scenario() -> None:
        node = await Node(private_etcd, "b1").start()
        fenced_at: list[float] = []
        node.view.on_change(lambda: fenced_at.append(time.monotonic()) if node.view.fenced else None)
        try:
            await eventually(lambda: not node.view.fenced, 5, "unfenced once registered")
            await eventually(lambda: node.view.leads(0), 10, "b1 leads partition 0")
            private_etcd.server.pause()
            paused_at = time.monotonic()
            last_proof = node.membership.proven_until - TTL
            await eventually(lambda: node.view.fenced, TTL + 1, "fenced while etcd is stopped")
            assert fenced_at, "view.changed() was called for the fencing"
            # fenced a margin before etcd could have ended the lease (and not before that margin)
            assert TTL - fence_margin_s(TTL) - 0.1 <= fenced_at[0] - last_proof < TTL
            assert fenced_at[0] - paused_at < TTL
            assert not node.view.leads(0)
            await asyncio.sleep(TTL)  # past the lease's TTL: etcd will have ended it when it runs again
            private_etcd.server.resume()
            await eventually(lambda: not node.view.fenced, 15, "unfenced once etcd is back")
            lease = node.membership.lease_id
            assert lease is not None
            found = await node.etcd.get(node.keys.member("b1"))
            assert found is not None and found.lease == lease
        finally:
            private_etcd.server.resume()
            await node.stop()

    run(scenario())


# -- the leader's in-sync set changes ------------------------------------------------------------------------


def test_only_the_current_leader_changes_the_in_sync_set_and_only_under_its_epoch(etcd: EtcdTarget) -> None:
    async def scenario() -> None:
        nodes = await start_nodes(etcd, ["b1", "b2", "b3"], partitions=1)
        try:
            await settled(nodes, 1, 3)
            view = nodes[0].view
            state = view.states[0]
            leader = next(n for n in nodes if n.node_id == state.leader)
            follower = next(n for n in nodes if n.node_id != state.leader)
            follower_id = follower.node_id

            # a follower, or the leader under a stale epoch, changes nothing
            assert not await follower.coordinator.shrink_isr(0, state.epoch, leader.node_id)
            assert not await leader.coordinator.shrink_isr(0, state.epoch - 1, follower_id)
            assert not await leader.coordinator.expand_isr(0, state.epoch, "b9")  # not a replica
            with pytest.raises(ValueError, match="node"):
                await leader.coordinator.shrink_isr(0, state.epoch, leader.node_id)

            assert await leader.coordinator.shrink_isr(0, state.epoch, follower_id)
            assert follower_id not in leader.view.states[0].isr  # the leader's own view at once
            await eventually(lambda: follower_id not in view.states[0].isr, 5, "everyone sees the shrink")
            assert view.states[0].epoch == state.epoch  # an in-sync set change is not a leader change
            assert await leader.coordinator.shrink_isr(0, state.epoch, follower_id)  # already out: done

            other = next(n for n in nodes if n.node_id not in (leader.node_id, follower_id))
            assert await leader.coordinator.shrink_isr(0, state.epoch, other.node_id)
            assert await leader.coordinator.expand_isr(0, state.epoch, follower_id)
            assert await leader.coordinator.expand_isr(0, state.epoch, other.node_id)
            await eventually(lambda: set(view.states[0].isr) == {"b1", "b2", "b3"}, 5, "all back in sync")

            # a replica that died is never added back, however caught up it looked when it died
            await other.die()
            await eventually(lambda: other.node_id not in leader.view.members, TTL + 5, "its lease ended")
            await eventually(lambda: other.node_id not in leader.view.states[0].isr, 10, "it left the ISR")
            assert not await leader.coordinator.expand_isr(0, leader.view.states[0].epoch, other.node_id)

            # a leader whose lease is gone writes nothing, even with the right epoch
            await leader.die()
            gone = leader.node_id
            await eventually(lambda: gone not in follower.view.members, TTL + 5, "the leader's lease ended")
            assert not await leader.coordinator.shrink_isr(0, state.epoch, follower_id)
            found = await follower.etcd.get(follower.keys.partition(0))
            assert found is not None and follower_id in json.loads(found.value)["isr"]
        finally:
            for node in nodes:
                await node.stop()

    run(scenario())


def test_a_broker_process_fences_itself_while_etcd_is_stopped(
    cluster_brokers: Callable[..., BrokerProcess], private_etcd: EtcdTarget
) -> None:
    broker = cluster_brokers("b1", target=private_etcd, lease_ttl_s=TTL)
    logged = partial(broker_log_count, broker)

    async def scenario() -> float:
        await eventually(lambda: logged("b1 unfenced") == 1, 10, "b1 registered and unfenced")
        private_etcd.server.pause()
        try:
            return await eventually(
                lambda: logged("b1 cannot prove its etcd lease alive") == 1, TTL + 2, "fenced"
            )
        finally:
            private_etcd.server.resume()

    fenced_after = run(scenario())
    assert fenced_after < TTL
    run(eventually(lambda: logged("b1 unfenced") == 2, 15, "unfenced once etcd runs again"))


def test_a_controller_fenced_for_a_moment_without_losing_its_lease_is_the_controller_again(
    private_etcd: EtcdTarget,
) -> None:
    async def scenario() -> None:
        node = await Node(private_etcd, "b1", lease_ttl_s=4).start()
        try:
            await eventually(lambda: node.controller.is_controller, 10, "b1 controller")
            lease = node.membership.lease_id
            private_etcd.server.pause()
            try:
                await eventually(lambda: node.view.fenced, 5, "fenced while etcd is stopped")
                await eventually(lambda: not node.controller.is_controller, 2, "not controlling while fenced")
            finally:
                private_etcd.server.resume()  # before the lease's TTL has run out
            await eventually(lambda: not node.view.fenced, 5, "unfenced: the same lease proven alive")
            assert node.membership.lease_id == lease
            await eventually(lambda: node.controller.is_controller, 5, "b1 is the controller again")
        finally:
            await node.stop()

    run(scenario())


# -- an etcd restart moves nothing ---------------------------------------------------------------------------


def test_an_etcd_restart_keeps_every_lease_the_controller_and_every_leader(private_etcd: EtcdTarget) -> None:
    """etcd killed for longer than the leases' TTL, then started again on its data: every member is fenced
    meanwhile, then renews the lease it had (etcd restores leases on restart), so nobody registers anew, the
    controller stays, and no partition gets a new leader or epoch."""

    async def scenario() -> None:
        nodes = await start_nodes(private_etcd, ["b1", "b2", "b3"], partitions=3)
        try:
            await settled(nodes, 3, 3)
            await eventually(lambda: all(spread(n.view) == [1, 1, 1] for n in nodes), 20, "leadership spread")
            before = dict(nodes[0].view.states)
            leases = {n.node_id: n.membership.lease_id for n in nodes}
            controllers = [n.node_id for n in nodes if n.controller.is_controller]
            registrations = {n.node_id: 0 for n in nodes}

            def registered_again(name: str) -> Callable[[], None]:
                return lambda: registrations.__setitem__(name, registrations[name] + 1)

            for node in nodes:
                node.membership.on_registered(registered_again(node.node_id))
            private_etcd.server.kill()
            await eventually(lambda: all(n.view.fenced for n in nodes), TTL + 2, "every member fenced")
            await asyncio.sleep(TTL)
            private_etcd.server.start()
            await eventually(lambda: not any(n.view.fenced for n in nodes), 20, "every member unfenced")
            await asyncio.sleep(TTL + 1)  # past the controller's grace: a move would have been made by now
            assert {n.node_id: n.membership.lease_id for n in nodes} == leases
            assert registrations == {"b1": 0, "b2": 0, "b3": 0}
            assert [n.node_id for n in nodes if n.controller.is_controller] == controllers
            for node in nodes:
                assert {p: (s.leader, s.epoch) for p, s in node.view.states.items()} == {
                    p: (s.leader, s.epoch) for p, s in before.items()
                }
        finally:
            for node in nodes:
                await node.stop()

    run(scenario(), 120)


PAUSE_S = 5.0


def test_a_coordinator_stopped_while_its_watch_outlives_a_cancellation_stops_without_an_error(
    private_etcd: EtcdTarget, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gRPC may turn a cancellation into an error of the call, which the watch retries after a pause
    (``cluster/tasks.py``): the stop cancels again, and that reaches the watch in the coordinator's own task,
    so the watch ends and is closed quietly (run in a task of its own, it was closed while still running
    there: "aclose(): asynchronous generator is already running", logged as a failed coordinator)."""

    async def scenario() -> float:
        node = await Node(private_etcd, "b1").start()
        real_watch = node.etcd.watch_prefix

        async def watch_that_outlives_a_cancellation(
            prefix: str, start_revision: int, retry_delay_s: float = 0.5
        ) -> AsyncGenerator[WatchEvent, None]:
            async with contextlib.aclosing(real_watch(prefix, start_revision, retry_delay_s)) as events:
                try:
                    async for event in events:
                        yield event
                except asyncio.CancelledError:
                    await asyncio.sleep(PAUSE_S)  # the retry's pause; a cancellation now ends it
                    raise

        monkeypatch.setattr(node.etcd, "watch_prefix", watch_that_outlives_a_cancellation)
        try:
            await node.coordinator.resync()  # watching through the wrapper
            await eventually(lambda: "b1" in node.view.members, 10, "b1 registered and seen")
            began = time.monotonic()
            await node.coordinator.stop()
            return time.monotonic() - began
        finally:
            await node.stop()

    with caplog.at_level("WARNING", logger="broker_edge"):
        took = run(scenario())
    assert took < PAUSE_S, "the second cancellation ends the watch's pause"
    # a loaded machine may fence the node (its own ERROR): what counts here is its tasks' failures
    failed = [
        r.getMessage() for r in caplog.records if r.levelname == "ERROR" and r.name == "broker_edge.cluster"
    ]
    assert failed == []


class LateRenewals(Etcd):
    """A real etcd client whose lease renewals are answered ``delay_s`` late (a busy node or etcd), noting
    when each was sent."""

    delay_s = 0.9

    def __init__(self, target: EtcdTarget) -> None:
        super().__init__([target.url], 1.0, target.server.tls, target.auth)
        self.sent: list[float] = []

    async def keep_alive(self, lease_id: int, timeout_s: float | None = None) -> int:
        self.sent.append(time.monotonic())
        ttl = await super().keep_alive(lease_id, timeout_s)
        await asyncio.sleep(self.delay_s)
        return ttl


def test_renewals_answered_late_keep_their_interval_and_the_node_unfenced(etcd: EtcdTarget) -> None:
    """Each renewal answered 0.9 s late, of a 3 s lease whose renewals are 1 s apart and whose node fences
    2.25 s after its last proof: the next renewal is sent one interval after the last was sent, not after
    its answer, so every proof comes in time and the node never fences."""

    async def scenario() -> None:
        node = Node(etcd, "b1", lease_ttl_s=3)
        late = node.membership.etcd = LateRenewals(etcd)
        fenced: list[float] = []
        await node.start()
        node.view.on_change(lambda: fenced.append(time.monotonic()) if node.view.fenced else None)
        try:
            await eventually(lambda: not node.view.fenced, 5, "unfenced once registered")
            await asyncio.sleep(6)
            assert not fenced, "fenced while renewals were answered late"
        finally:
            await node.stop()
            await late.close()
        gaps = [later - earlier for earlier, later in zip(late.sent, late.sent[1:], strict=False)]
        assert len(late.sent) >= 5 and max(gaps) < 1.3, gaps

    run(scenario())
